"""How often a client may guess the dashboard's password: free for a few tries, then with a wait
that doubles after each wrong one, up to five minutes; a right password clears the count.

    THROTTLE = LoginThrottle()
    wait_s = THROTTLE.wait_s("ip:10.0.0.5")   # 0.0: may try now
    THROTTLE.failed("ip:10.0.0.5")            # seconds before the next try

One instance serves every session of the server process (keys name a session or a client address),
is safe to call from Streamlit's script threads, and holds at most ``max_clients`` keys: the ones
with the oldest failures are forgotten first.

A client is an IPv4 address, or an IPv6 address's /64 prefix (``client_key``): a host is given a
whole /64 and can try from a new address each time. Over every client together, a
``FailureBudget`` allows so many wrong passwords in a window, so that many addresses neither buy
many guesses nor flush the table.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

FREE_TRIES = 3
MAX_WAIT_S = 300.0
MAX_CLIENTS = 10_000
# Wrong passwords from all clients together: one client alone gets about a dozen in ten minutes.
BUDGET_FAILURES, BUDGET_WINDOW_S = 100, 600.0


def client_key(address: str) -> str:
    """What a client's tries count against: an IPv4 address itself (also when written as an
    IPv4-mapped IPv6 address), an IPv6 address's /64 network; anything else as given."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # without a zone (fe80::1%eth0)
    except ValueError:
        return address
    if ip.version == 4:
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


class FailureBudget:
    """At most ``limit`` wrong passwords in any ``window_s`` seconds, whoever sends them; past it
    every try waits until the oldest leaves the window (a right password included: guesses from
    many addresses must not get through, even at the cost of the owner's wait)."""

    def __init__(self, *, limit: int = BUDGET_FAILURES, window_s: float = BUDGET_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic):
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self._times: deque[float] = deque(maxlen=limit)  # the newest ``limit`` failures
        self._lock = threading.Lock()

    def wait_s(self) -> float:
        with self._lock:
            if len(self._times) < self.limit:
                return 0.0
            return max(0.0, self._times[0] + self.window_s - self._clock())

    def failed(self) -> None:
        with self._lock:
            self._times.append(self._clock())


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
