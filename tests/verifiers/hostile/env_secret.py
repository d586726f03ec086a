"""Find the parent's secret in its own environment or any process's /proc/*/environ."""
import os


def attack():
    secret = "{{SECRET}}"
    if any(secret in v for v in os.environ.values()):
        return "escaped"
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if secret.encode() in f.read():
                    return "escaped"
        except OSError:
            pass
    raise AssertionError("secret not found")
