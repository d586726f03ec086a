"""Wrong API keys, throttled per client: the login form's and every bearer header's.

After :data:`KEY_FAILURES` wrong keys from one client, none of them more than
:data:`KEY_WINDOW_SECONDS` after the one before, every key it sends, right or wrong, is refused
unread (429 with ``Retry-After``) for a lockout that doubles with each further
wrong key, from one second up to :data:`LONGEST_LOCKOUT_SECONDS`. A right key
sent while locked out is refused too: otherwise the answer to a flood tells the
guesser which guess was right. Keys sent while locked out are not counted, so
the lockout never outlasts its longest step after the last wrong key: the user
whose own typo, or whose neighbour's flood, locked them out is let in again
within half a minute of it. Clients are :class:`~refinery.serving.clients.ClientId`
s: on loopback the local user, so another user's flood locks out only itself.

Example:
    >>> throttle = KeyThrottle(failures=2)
    >>> throttle.check(ClientId("a"))
    >>> throttle.failed(ClientId("a")), throttle.failed(ClientId("a"))
    (None, None)
    >>> try:
    ...     throttle.check(ClientId("a"))
    ... except TooManyWrongKeysError as exc:
    ...     exc.retry_after
    1
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from refinery.engine.errors import OverCapacityError
from refinery.serving.clients import ClientId

KEY_FAILURES = 5  # wrong keys per client per window before the first lockout
KEY_WINDOW_SECONDS = 60.0
FIRST_LOCKOUT_SECONDS = 1.0
LONGEST_LOCKOUT_SECONDS = 30.0


class TooManyWrongKeysError(OverCapacityError):
    """A client that sent too many wrong keys lately; ``retry_after`` seconds to wait."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message, code="too_many_wrong_keys")
        self.retry_after = retry_after


@dataclass
class _Record:
    failures: int = 0  # wrong keys since the client was last quiet for a window
    last: float = 0.0
    locked_until: float = 0.0


class KeyThrottle:
    """Wrong keys per client, and the lockouts they earn (thread-safe; at most
    ``max_clients`` remembered, the least recently seen forgotten first)."""

    def __init__(self, failures: int = KEY_FAILURES, window: float = KEY_WINDOW_SECONDS,
                 first: float = FIRST_LOCKOUT_SECONDS, longest: float = LONGEST_LOCKOUT_SECONDS,
                 clock: Callable[[], float] = time.monotonic, max_clients: int = 4096):
        self.failures, self.window, self.clock = failures, window, clock
        self.first, self.longest, self.max_clients = first, longest, max_clients
        self._clients: OrderedDict[ClientId, _Record] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, client: ClientId) -> None:
        """Raises:
            TooManyWrongKeysError: ``client`` is locked out: no key of it is read now.
        """
        with self._lock:
            record = self._clients.get(client)
            wait = record.locked_until - self.clock() if record else 0.0
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise TooManyWrongKeysError(f"too many wrong keys from this client; try again "
                                        f"in {seconds} s", retry_after=seconds)

    def failed(self, client: ClientId) -> None:
        """Count one wrong key from ``client``; past the limit, lock it out."""
        now = self.clock()
        with self._lock:
            record = self._record(client)
            if now - record.last > self.window:  # quiet for a window: a clean slate
                record.failures = 0
            record.failures += 1
            record.last = now
            over = record.failures - self.failures
            if over >= 0:
                record.locked_until = now + min(self.longest, self.first * 2.0 ** min(over, 60))

    def _record(self, client: ClientId) -> _Record:
        record = self._clients.pop(client, None) or _Record()
        self._clients[client] = record
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
        return record


def key_throttle(app: Any) -> KeyThrottle:
    """The app's :class:`KeyThrottle` (made on first use: the API and the page share it)."""
    throttle = getattr(app.state, "key_throttle", None)
    if throttle is None:
        throttle = app.state.key_throttle = KeyThrottle()
    return throttle
