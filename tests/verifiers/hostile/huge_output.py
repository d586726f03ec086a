"""Flood stdout and stderr."""
import sys


def attack():
    line = "A" * 1023 + "\n"
    while True:
        sys.stdout.write(line)
        sys.stderr.write(line)
