"""Read host files: root's home, the project's source, system configuration, devices.

``{{PROJECT}}`` is the checkout, filled in by the test.
"""
import os


def attack():
    found = []
    for path in ("/root/.bashrc", "{{PROJECT}}/pyproject.toml", "{{PROJECT}}", "/home",
                 "/var/log", "/etc/hostname", "/etc/passwd", "/run", "/sys/class/net"):
        try:
            if os.path.isdir(path):
                found += os.listdir(path)
            else:
                with open(path, "rb") as f:
                    found.append(f.read(100))
        except OSError:
            pass
    assert found, "nothing of the host is readable"
    return "escaped"
