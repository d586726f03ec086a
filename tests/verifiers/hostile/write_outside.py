"""Write into a host directory (world-writable on the host), the system and its own source."""


def attack():
    written = []
    for path in ("{{CANARY}}/pwned.txt", "{{CANARY}}/keep.txt", "/usr/pwned.txt",
                 "/etc/pwned.txt", "/sandbox/main.py", "/root/pwned.txt", "/pwned.txt"):
        try:
            with open(path, "w") as f:
                f.write("pwned")
            written.append(path)
        except OSError:
            pass
    assert written, "no write outside the sandbox succeeded"
    return "escaped"
