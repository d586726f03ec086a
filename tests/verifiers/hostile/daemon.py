"""Double fork + setsid: a daemon meant to outlive the run (its cmdline carries a marker)."""
import os


def attack():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/usr/bin/python3", ["/usr/bin/python3", "-c",
                     "import time\nwhile True: time.sleep(1)  # {{MARKER}}"])
        os._exit(0)
    os._exit(0)  # the parent leaves at once, as a daemonizing program does
