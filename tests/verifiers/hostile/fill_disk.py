"""Fill every writable filesystem with 1 MB files."""
import os


def attack():
    total = 0
    for d in ("/", "/work", "/tmp", "/dev/shm", os.getcwd()):
        i = 0
        try:
            while True:
                with open(os.path.join(d, f"fill{i}"), "wb") as f:
                    f.write(b"\0" * 2**20)
                i += 1
                total += 1
        except OSError:
            pass
    assert total > 1024, f"only {total} MB written"
    return "escaped"
