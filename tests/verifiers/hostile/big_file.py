"""Write one file larger than the file-size limit (SIGXFSZ)."""


def attack():
    with open("big.bin", "wb") as f:
        for _ in range(1024):
            f.write(b"\0" * 2**20)
    return "escaped"
