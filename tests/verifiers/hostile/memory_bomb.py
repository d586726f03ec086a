"""Allocate and touch 100 MB blocks until the address space runs out."""


def attack():
    hoard = []
    while True:
        block = bytearray(100 * 2**20)
        block[::4096] = b"x" * len(block[::4096])
        hoard.append(block)
