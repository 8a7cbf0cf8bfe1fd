"""Failed logins, counted per user name and per client address, in this process's memory.

After :attr:`LoginThrottle.limit` failures within :attr:`LoginThrottle.window` seconds
for a name or an address, every login for it is refused (even one with the right
password) until the oldest of those failures is older than the window. A success does
not wipe the count: an attacker who guesses in turn with the real user gains nothing.
The count lives in one process: each server process keeps its own, and a restart forgets it.
"""

from __future__ import annotations

import math
import threading
from collections import deque

from plangate._clock import Clock, SystemClock
from plangate.names import skeleton


class LoginThrottle:
    def __init__(
        self, *, limit: int = 5, window: float = 900.0, clock: Clock | None = None, max_keys: int = 100_000
    ) -> None:
        self.limit, self.window, self.max_keys = limit, window, max_keys
        self.clock = clock or SystemClock()
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def wait(self, name: str, address: str) -> int:
        """Seconds until a login for ``name`` from ``address`` may be tried again; 0 if it may be now."""
        now = self._now()
        with self._lock:
            waits = [self._wait(key, now) for key in _keys(name, address)]
        return max(waits)

    def failed(self, name: str, address: str) -> None:
        now = self._now()
        with self._lock:
            if len(self._failures) >= self.max_keys:
                self._forget(now)
            for key in _keys(name, address):
                self._failures.setdefault(key, deque(maxlen=self.limit)).append(now)

    def _wait(self, key: str, now: float) -> int:
        times = self._failures.get(key)
        if times is None or len(times) < self.limit:
            return 0
        return max(0, math.ceil(times[0] + self.window - now))  # the deque holds the newest `limit` failures

    def _forget(self, now: float) -> None:
        """Drop keys whose failures are all older than the window; if that is not enough, the oldest keys."""
        for key in [k for k, times in self._failures.items() if times[-1] + self.window <= now]:
            del self._failures[key]
        while len(self._failures) >= self.max_keys:
            del self._failures[next(iter(self._failures))]

    def _now(self) -> float:
        return self.clock.now().timestamp()


def _keys(name: str, address: str) -> tuple[str, str]:
    return f"name:{skeleton(name)}", f"address:{address}"  # one count for every spelling of one name
