"""How often a client may guess the dashboard's password: free for a few tries, then with a wait
that doubles after each wrong one, up to five minutes; a right password clears the count.

    THROTTLE = LoginThrottle()
    wait_s = THROTTLE.wait_s("ip:10.0.0.5")   # 0.0: may try now
    THROTTLE.failed("ip:10.0.0.5")            # seconds before the next try

One instance serves every session of the server process (keys name a session or a client address),
is safe to call from Streamlit's script threads, and holds at most ``max_clients`` keys: the ones
with the oldest failures are forgotten first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

FREE_TRIES = 3
MAX_WAIT_S = 300.0
MAX_CLIENTS = 10_000


class LoginThrottle:
    def __init__(self, *, free_tries: int = FREE_TRIES, max_wait_s: float = MAX_WAIT_S,
                 max_clients: int = MAX_CLIENTS, clock: Callable[[], float] = time.monotonic):
        self._free_tries, self._max_wait_s, self._max_clients, self._clock = free_tries, max_wait_s, max_clients, clock
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # key -> (in a row, when the last was)
        self._lock = threading.Lock()

    def _delay_s(self, failures: int) -> float:
        if failures < self._free_tries:
            return 0.0
        return min(self._max_wait_s, 2.0 ** (failures - self._free_tries))

    def wait_s(self, key: str) -> float:
        """Seconds before ``key`` may try again; 0.0 when it may try now."""
        with self._lock:
            failures, last = self._failures.get(key, (0, 0.0))
            return max(0.0, last + self._delay_s(failures) - self._clock()) if failures else 0.0

    def failed(self, key: str) -> float:
        """Count a wrong password for ``key``; returns the seconds it must wait before the next try."""
        with self._lock:
            failures = self._failures.pop(key, (0, 0.0))[0] + 1
            self._failures[key] = (failures, self._clock())  # the newest at the end
            while len(self._failures) > self._max_clients:
                self._failures.popitem(last=False)
            return self._delay_s(failures)

    def failures(self, key: str) -> int:
        with self._lock:
            return self._failures.get(key, (0, 0.0))[0]

    def succeeded(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def __len__(self) -> int:
        return len(self._failures)
