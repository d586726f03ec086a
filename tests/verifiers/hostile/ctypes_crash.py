"""Dereference NULL through ctypes: a segfault."""
import ctypes


def attack():
    ctypes.string_at(0)
    return "escaped"
