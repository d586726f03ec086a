"""Blow the C stack: the recursion limit lifted, then a C-level recursion (repr of deep nesting)."""
import sys


def attack():
    sys.setrecursionlimit(10**8)
    nested = []
    for _ in range(10**6):
        nested = [nested]
    return repr(nested)
