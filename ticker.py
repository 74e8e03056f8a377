"""The ticker: the monotonic time the supervisor and the actors pace themselves by (restart
back-off, the restart intensity window, periodic ticks, the reput linger), passed in like
the wall clock `clock_ms` (STYLE habit 9). Production runs on `RealTicker`; a test passes a
`ManualTicker`, whose time moves only when the test (or a sleep) moves it, so restart and
linger tests assert exact numbers instead of polling a real clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Ticker", "RealTicker", "ManualTicker"]


class Ticker(Protocol):
    def now_ms(self) -> int:
        """Monotonic milliseconds (any origin)."""
        ...

    def sleep_ms(self, ms: int) -> None:
        """Pause the calling thread for `ms` of this ticker's time."""
        ...

    def wait_s(self, ms: int) -> float | None:
        """How long a thread that waits `ms` of this ticker's time for an event blocks in real
        seconds; None: until woken (a manual ticker wakes waiters through `on_advance`)."""
        ...

    def on_advance(self, wake: Callable[[], None]) -> None:
        """Call `wake` whenever time jumps (a manual ticker's advance); a real one never does."""
        ...


class RealTicker:
    """time.monotonic and time.sleep."""

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def sleep_ms(self, ms: int) -> None:
        if ms > 0:
            time.sleep(ms / 1000)

    def wait_s(self, ms: int) -> float | None:
        return max(ms, 0) / 1000

    def on_advance(self, wake: Callable[[], None]) -> None:
        return None


class ManualTicker:
    """Time that moves only by `advance` (which wakes the waiters) and by `sleep_ms`, which
    returns at once, records the pause in `sleeps` and moves the time by it (unless
    `sleeps_move_time` is False: for a test that counts exact intervals, where a store
    thread's pause, reput's linger of a ms per notice, would move its time at any moment).
    Thread-safe."""

    def __init__(self, start_ms: int = 1_000_000, *, sleeps_move_time: bool = True) -> None:
        self._now_ms = start_ms
        self._sleeps_move_time = sleeps_move_time
        self._lock = threading.Lock()
        self._wakes: list[Callable[[], None]] = []
        self.sleeps: list[int] = []

    def now_ms(self) -> int:
        with self._lock:
            return self._now_ms

    def sleep_ms(self, ms: int) -> None:
        with self._lock:
            self.sleeps.append(ms)
            if self._sleeps_move_time:
                self._now_ms += max(ms, 0)

    def wait_s(self, ms: int) -> float | None:
        return None

    def on_advance(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._wakes.append(wake)

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError(f"ms must not be negative, not {ms}")
        with self._lock:
            self._now_ms += ms
            wakes = list(self._wakes)
        for wake in wakes:
            wake()
