"""The read view: one frozen value holding every fact a reader of the store's files needs.

Owners publish, readers take. The writer publishes the commitlog's readable end, the reput
actor the dispatched end, the ConsumeQueue actor each queue's bounds (and the commitlog offset
below which every dispatched unit is written), the index actor its file names and indexed end.
Each publication builds a new `ReadView` and swaps it in with one reference assignment, so a
reader that takes `publisher.view` once per call sees the facts of one moment together: no
torn pairs are possible by construction, and readers take no lock.

Owners publish from their own threads, so publications are serialised by one lock (a swap is
read-copy-update); conditions on the same lock wake readers waiting for the view to cover a
target (read-your-writes, long polling). A waiter names the publications that can make its
target true (`wakes_on`), and a publication wakes only those: a consumer long-polling a queue
is not woken by every writer pass and dispatch batch to find nothing new (each such wake-up
took the GIL from the put path, on another CPU). Publishing never blocks beyond that lock and
never calls out.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Callable, Mapping

from .messages import QueueBounds
from .waits import Sleepers

__all__ = [
    "ANY_PUBLICATION",
    "COMMITLOG",
    "DISPATCHED",
    "INDEX",
    "NOT_THE_LOG",
    "QUEUES",
    "QueueKey",
    "ReadView",
    "ReadViewPublisher",
    "in_ranges",
    "without_ranges",
]

QueueKey = tuple[str, int]
_NO_BOUNDS: Mapping[QueueKey, tuple[int, int]] = MappingProxyType({})
_NO_SEGMENTS: Mapping[int, tuple[int, int]] = MappingProxyType({})
# In `segments`: no file at that path is the log (a segment found replaced). No file's identity.
NOT_THE_LOG: tuple[int, int] = (-1, -1)

# What a publication changed, and what a waiter waits on (bits of `wakes_on`). Plain ints: the
# writer publishes once per put pass. Closing and quarantine publications wake every waiter.
COMMITLOG = 1  # readable_end
DISPATCHED = 2  # dispatched_end
QUEUES = 4  # queues_live, queue_bounds, queues_written, map_generation
INDEX = 8  # index_files, indexed_end
ANY_PUBLICATION = COMMITLOG | DISPATCHED | QUEUES | INDEX
_EVERY_WAITER = -1  # all bits: closing (and a new quarantine) wakes whatever a waiter waits on


@dataclass(frozen=True, slots=True)
class ReadView:
    """What readers may rely on, as of one publication.

    - `readable_end`: the commitlog may be read below this offset (the writer's watermark).
    - `dispatched_end`: the reput actor has dispatched every record below this offset.
    - `queues_live`: the ConsumeQueue actor has published since its (re)start; until then
      `queue_bounds` decide nothing and readers ask the actor.
    - `queue_bounds`: per (topic, queueId) the (min, max) queue offsets, every unit below max
      written. A live table is complete: a queue not in it does not exist.
    - `queues_written`: every unit of a record below this commitlog offset is in `queue_bounds`.
    - `index_files`: the index file names, oldest first (None: not published since start).
    - `indexed_end`: every record below this commitlog offset is indexed.
    - `map_generation`: bumped when files a reader maps may be gone (deleted or truncated by a
      restarted owner); a reader seeing a new generation drops its maps.
    - `closed`: the store is closing, or its supervisor gave up: nothing will be published
      again, and waiters return at once.
    - `quarantined`: commitlog [start, end) ranges recovery found damaged with valid records
      after them, sorted: never served and never dispatched, whatever `check_crc_on_read` says.
    - `replaced`: the [start, end) ranges of commitlog segments another process replaced,
      renamed away or deleted under the running store (the writer found them, and saved its
      copies beside them), sorted: the file at such a segment's path is not the log, so a read
      there stops, its offset kept, until the copy is moved back (review 145 F2).
    - `segments`: per commitlog segment start, the (device, inode) of the file the writer
      maps there. A reader that maps another file at that path reads it as "not now", never
      as the log: the segment was replaced in the moment before the writer's next check
      (review 145 F3: an older backup of it was read as its own, another store's as this one's).
    """

    readable_end: int = 0
    dispatched_end: int = 0
    queues_live: bool = False
    queue_bounds: Mapping[QueueKey, tuple[int, int]] = field(default_factory=lambda: _NO_BOUNDS)
    queues_written: int = 0
    index_files: tuple[str, ...] | None = None
    indexed_end: int = 0
    map_generation: int = 0
    closed: bool = False
    quarantined: tuple[tuple[int, int], ...] = ()
    replaced: tuple[tuple[int, int], ...] = ()
    segments: Mapping[int, tuple[int, int]] = field(default_factory=lambda: _NO_SEGMENTS)

    def is_quarantined(self, offset: int) -> bool:
        """Whether a record at `offset` lies in damage recovery quarantined."""
        return in_ranges(self.quarantined, offset)


def _merged(known: tuple[tuple[int, int], ...], ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """`known` and `ranges` as sorted, disjoint [start, end) ranges (overlaps merged), as `in_ranges` takes them."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(set(known) | set(ranges)):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def without_ranges(ranges: tuple[tuple[int, int], ...], taken: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """What of the [start, end) `ranges` lies outside every range of `taken`, in order."""
    left: list[tuple[int, int]] = []
    cuts = sorted(taken)
    for start, end in ranges:
        for cut_start, cut_end in cuts:
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                left.append((start, cut_start))
            start = max(start, cut_end)
            if start >= end:
                break
        if start < end:
            left.append((start, end))
    return tuple(left)


def in_ranges(ranges: tuple[tuple[int, int], ...], offset: int) -> bool:
    """Whether `offset` lies in one of the sorted, disjoint [start, end) `ranges`."""
    if not ranges:
        return False
    at = bisect.bisect_right(ranges, (offset, 2**63)) - 1
    return at >= 0 and ranges[at][0] <= offset < ranges[at][1]


class ReadViewPublisher:
    """The one place the read view is published and waited on (one per store)."""

    def __init__(self) -> None:
        self.view = ReadView()
        # Taken by owners to publish and by callers' threads only to (un)register a waiter,
        # never across a wait (waits.py).
        self._lock = threading.Lock()
        # The waiters per distinct `wakes_on` (a handful), so a publication nobody waits for
        # wakes nobody; each sleeps on a raw lock of its own (waits.Sleepers, guarded by
        # `_lock`), which a publication releases.
        self._waiting: dict[int, Sleepers] = {}
        # The end of the newest put the writer answered as stored (this run), set before it
        # answers: a read for someone the store cannot name (a gateway read answered to a
        # future or a callback) reflects everything below it as it starts. A plain int, not
        # in the view: one writer sets it, and no reader waits on it.
        self.acked_end = 0
        # The writer's own table of next queue offsets ("topic-queueId" -> the offset its next
        # put there takes), given here at each start before it takes a put, and read only by
        # readers: a queue whose next offset the view's bounds reach has no put appended that
        # the view lacks, so a read at its end waits for nobody's put (review 107 J1).
        self.next_queue_offsets: Mapping[str, int] = {}

    def _swap(self, view: ReadView, changed: int) -> None:
        # Called with the lock held: the one reference assignment readers see.
        self.view = view
        for wakes_on, sleepers in self._waiting.items():
            if sleepers and wakes_on & changed:
                sleepers.wake_all()

    # publications (each from its owner's thread) ----------------------------------------
    def publish_commitlog(self, readable_end: int) -> None:
        """The writer (once per put pass): the commitlog is readable below `readable_end`."""
        with self._lock:
            v = self.view
            if readable_end > v.readable_end:
                # Positional rather than `replace` (1.1 us against 2.5 hot, more on the writer's
                # cold pass); every field in order (tests/actors/test_writer_fast_append.py).
                self._swap(ReadView(readable_end, v.dispatched_end, v.queues_live, v.queue_bounds, v.queues_written,
                                    v.index_files, v.indexed_end, v.map_generation, v.closed, v.quarantined, v.replaced,
                                    v.segments),
                           COMMITLOG)  # fmt: skip

    def publish_next_queue_offsets(self, table: Mapping[str, int]) -> None:
        """The writer, at its start before it takes a put: its live table of next queue
        offsets (it updates the table as it appends, before answering any put)."""
        self.next_queue_offsets = table

    def publish_acked(self, end: int) -> None:
        """The writer, before it answers a pass's stored puts: they end below `end`."""
        if end > self.acked_end:
            self.acked_end = end

    def publish_dispatched(self, dispatched_end: int) -> None:
        """The reput actor: every record below `dispatched_end` was handed to its dispatchers."""
        with self._lock:
            if dispatched_end > self.view.dispatched_end:
                self._swap(replace(self.view, dispatched_end=dispatched_end), DISPATCHED)

    def publish_queues(self, published: QueueBounds | None) -> None:
        """The ConsumeQueue actor, after writing units (None: it stops, withdraw its bounds)."""
        with self._lock:
            view = self.view
            if published is None:
                self._swap(replace(view, queues_live=False, queue_bounds=_NO_BOUNDS,
                                   map_generation=view.map_generation + 1), QUEUES)  # fmt: skip
                return
            generation = view.map_generation
            if published.complete:
                table: dict[QueueKey, tuple[int, int]] = {}
                generation += 1  # a restarted actor may have truncated what readers map
            else:
                table = dict(view.queue_bounds)
            for key, bounds in published.bounds.items():
                previous = table.get(key)
                if previous is not None and bounds[0] > previous[0]:
                    generation += 1  # files below the new min may be deleted
                table[key] = bounds
            self._swap(replace(
                view,
                queues_live=True,
                queue_bounds=MappingProxyType(table),
                queues_written=max(view.queues_written, published.dispatched_offset)
                if not published.complete else published.dispatched_offset,
                map_generation=generation,
            ), QUEUES)  # fmt: skip

    def publish_index(self, files: tuple[str, ...], indexed_end: int) -> None:
        """The index actor: its files (oldest first) and the end of what it indexed."""
        with self._lock:
            self._swap(replace(self.view, index_files=files, indexed_end=indexed_end), INDEX)

    def add_quarantined(self, ranges: tuple[tuple[int, int], ...]) -> None:
        """The writer, after its recovery quarantined `ranges` (before any reader or dispatcher
        starts on a first start): added to what is known (overlaps merged, so the ranges stay
        sorted and disjoint for `in_ranges`)."""
        with self._lock:
            self._swap(replace(self.view, quarantined=_merged(self.view.quarantined, ranges)), _EVERY_WAITER)

    def publish_segments(self, segments: Mapping[int, tuple[int, int]]) -> None:
        """The writer, before any of a new segment is readable, and at its start: the
        (device, inode) of every segment it maps. Wakes nobody: no wait is on it."""
        with self._lock:
            self._swap(replace(self.view, segments=segments), 0)

    def current_segments(self) -> Mapping[int, tuple[int, int]]:
        """The writer's segment files now (`segments`), for a reader to compare a map with."""
        return self.view.segments

    def add_replaced(self, ranges: tuple[tuple[int, int], ...]) -> None:
        """The writer, on finding segments replaced under the store (or, restarted, their
        copies beside them): added to what is known, as `add_quarantined` adds."""
        with self._lock:
            self._swap(replace(self.view, replaced=_merged(self.view.replaced, ranges)), _EVERY_WAITER)

    def close(self) -> None:
        """The store closes, or its supervisor gave up: every waiter returns."""
        with self._lock:
            self._swap(replace(self.view, closed=True), _EVERY_WAITER)

    # waiting ----------------------------------------------------------------------------
    def await_view(
        self, covers: Callable[[ReadView], bool], timeout_s: float, wakes_on: int = ANY_PUBLICATION
    ) -> ReadView | None:
        """The current view once `covers(view)` holds (woken by publications, never by
        polling); None when `timeout_s` passed first or the store closed. `wakes_on`: the
        publications (COMMITLOG, DISPATCHED, QUEUES, INDEX) that change a field `covers` reads;
        only those wake this waiter, and closing always does."""
        if not wakes_on & ANY_PUBLICATION or wakes_on & ~ANY_PUBLICATION:
            raise ValueError(f"wakes_on must be a non-empty set of COMMITLOG, DISPATCHED, QUEUES, INDEX, not {wakes_on}")
        view = self.view
        if covers(view):
            return view
        if view.closed or timeout_s <= 0:
            return None
        sleepers = self._waiting.get(wakes_on)
        if sleepers is None:
            with self._lock:  # (nothing in here waits)
                sleepers = self._waiting.setdefault(wakes_on, Sleepers(self._lock))

        covering: list[ReadView] = []  # the view that `covers` held for, looked at once

        def covered_or_closed() -> bool:
            current = self.view
            if covers(current):
                covering.append(current)
                return True
            return current.closed

        sleepers.sleep_until(covered_or_closed, timeout_s)
        return covering[0] if covering else None
