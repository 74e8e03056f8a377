"""Named fault points (FoundationDB's BUGGIFY, in small) that do nothing in production.

Every actor calls `faults.hit("writer.mid_batch_append")` at the moments worth crashing in.
The default plan is empty, so a hit is one attribute read and one dict lookup. Tests arm a
point to raise `InjectedFault` the next N times it is reached; the actor crashes into its
supervisor exactly as a real bug would.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Final

__all__ = ["FaultPlan", "InjectedFault", "NO_FAULTS", "FAULT_POINTS"]

# The points that exist, so a test that arms a misspelt name fails instead of passing vacuously.
FAULT_POINTS: Final = frozenset(
    {
        "writer.mid_batch_append",
        "writer.after_append",
        "writer.after_refusal",  # a put the log refused (no segment to roll into, a full disk)
        "allocator.mid_allocation",
        "flush.mid_fsync",
        "reput.mid_dispatch",
        "consume_queue.mid_write",
        "index.mid_write",
        "cleaner.mid_delete",
        "gateway.mid_request",
    }
)


class InjectedFault(RuntimeError):
    """Raised at an armed fault point."""


class FaultPlan:
    """Which points fire, and how often. Thread-safe: points are hit from every actor thread."""

    def __init__(self) -> None:
        self._armed: dict[str, int] = {}
        self._lock = threading.Lock()
        self.fired: Counter[str] = Counter()

    def arm(self, point: str, times: int = 1) -> None:
        if point not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {point!r}; known: {sorted(FAULT_POINTS)}")
        with self._lock:
            self._armed[point] = self._armed.get(point, 0) + times

    def disarm_all(self) -> None:
        with self._lock:
            self._armed.clear()

    def hit(self, point: str) -> None:
        if not self._armed:  # the production path: nothing armed
            return
        with self._lock:
            left = self._armed.get(point, 0)
            if left <= 0:
                return
            if left == 1:
                del self._armed[point]
            else:
                self._armed[point] = left - 1
            self.fired[point] += 1
        raise InjectedFault(f"injected fault at {point}")


NO_FAULTS: Final = FaultPlan()


class HoldAt(FaultPlan):
    """Once armed, holds the actor that reaches `point` (its thread waits in `hit`) until
    `release` is set, at most `hold_s`: for tests that need an actor stopped mid-work. Every
    point, the held one after its hold too, faults as a FaultPlan's when armed (`arm`): a
    hold and a crash in one run."""

    def __init__(self, point: str, hold_s: float = 30.0) -> None:
        super().__init__()
        self.point = point
        self.hold_s = hold_s
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()

    def hit(self, point: str) -> None:
        if point == self.point and self.armed.is_set():
            self.armed.clear()
            self.entered.set()
            self.release.wait(self.hold_s)
        super().hit(point)
