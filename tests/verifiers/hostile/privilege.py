"""Become root, or create a user namespace to get capabilities inside it."""
import ctypes
import os


def attack():
    try:
        os.setuid(0)
        return "escaped"
    except OSError:  # EPERM, or EINVAL: uid 0 does not exist in the jail's namespace
        pass
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.unshare(0x10000000) == 0, "unshare(CLONE_NEWUSER) refused"  # CLONE_NEWUSER
    return "escaped"
