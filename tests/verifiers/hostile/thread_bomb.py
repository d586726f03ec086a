"""Start threads until the process limit refuses."""
import threading
import time


def attack():
    while True:
        threading.Thread(target=time.sleep, args=(10**6,), daemon=True).start()
