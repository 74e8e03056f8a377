"""The store's share of the process's map areas.

Every map is one area (a VMA), and `vm.max_map_count` (65,530 by default) bounds them for the
whole process: the host's own allocations need areas too (Python's arenas, thread stacks, large
buffers). The writer maps every segment, as RocketMQ does, so a long log of small segments took
them all: with 64 KiB segments and the limit at 3,000 the store held 2,700 maps, its next
segment was refused (ENOMEM), and then the host's own `bytearray(64 MiB)` raised MemoryError
and its `mmap` ENOMEM. The store now maps at most three quarters of the limit. Past that a new
map is refused the way the kernel refuses one at the limit (OSError ENOMEM, with a message
saying why), and every owner answers it as it answers a process out of maps: a put
CREATE_MAPPED_FILE_FAILED, a read "could not be mapped now" with nothing skipped, an open
refused before it changes a byte. The other quarter is the host's. RocketMQ's own os.sh raises
the limit to 655,360; so can the operator here (read again each second, and at once when the
share is used up).

A new file (the log's next segment, a queue's next file, an index file) stops an eighth short
of the share: the rest is for maps of the files already there, so that when the log's growth
has used its part up, puts are refused as on a full disk while gets and queries go on reading
what is stored (with all of the share to the log, a reader could not map a segment either).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from typing import Callable, Final

from mqstore import log as mqstore_log
from mqstore.log import get_logger

log = get_logger(__name__)

MAX_MAP_COUNT_PATH: Final = "/proc/sys/vm/max_map_count"
HOST_SHARE_DIVISOR: Final = 4  # the host keeps limit // 4 of the areas
READS_SHARE_DIVISOR: Final = 8  # of the store's share, kept for maps of files already there
LIMIT_READ_EVERY_S: Final = 1.0


def read_max_map_count(path: str = MAX_MAP_COUNT_PATH) -> int | None:
    """The kernel's per-process map limit; None where it cannot be read (not Linux, no /proc)."""
    try:
        with open(path, "rb") as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return value if value > 0 else None


def store_share(limit: int | None) -> int | None:
    """How many maps the store may hold under `limit` (None: no limit known)."""
    return None if limit is None else limit - limit // HOST_SHARE_DIVISOR


def new_file_share(share: int | None) -> int | None:
    """How many of them a map of a new file may make: the rest is for reading what is there."""
    return None if share is None else share - share // READS_SHARE_DIVISOR


class MapAreas:
    """Counts the store's live maps and refuses one past its share (see the module's doc).

    A map is counted from `take` until the release `take` returned is called, once (by its
    region's close, or by a finalizer when the map goes without one): an RLock, because that
    finalizer may run in a garbage collection started inside `take` itself."""

    def __init__(
        self, read_limit: Callable[[], int | None] = read_max_map_count, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._read_limit = read_limit
        self._clock = clock
        self._lock = threading.RLock()
        self._live = 0
        self._limit: int | None = None
        self._limit_read_at: float | None = None

    @property
    def live(self) -> int:
        return self._live

    def share(self, *, fresh: bool = False) -> int | None:
        """The store's share now (None: unbounded). The limit is read again at most once a
        second (an operator may raise or lower it at any time), and at once with `fresh`."""
        with self._lock:
            now = self._clock()
            if fresh or self._limit_read_at is None or now - self._limit_read_at >= LIMIT_READ_EVERY_S:
                self._limit, self._limit_read_at = self._read_limit(), now
            return store_share(self._limit)

    def take(self, path: str, *, new_file: bool = False) -> Callable[[], None]:
        """Count one more map of `path`, or raise OSError(ENOMEM) if the store holds its share
        (for a `new_file`, its share less what is kept for reads)."""
        with self._lock:
            bound = self._bound(self.share(), new_file)
            if bound is not None and self._live >= bound:
                bound = self._bound(self.share(fresh=True), new_file)  # raised within the second, maybe
            refused = bound is not None and self._live >= bound
            if not refused:
                self._live += 1
            live, limit = self._live, self._limit
        if refused:
            # Said outside the lock: a finalizer's release() waits for it, and one may run in a
            # collection inside a logging handler that holds its own lock (review 91 A1).
            assert bound is not None and limit is not None
            self._refuse(path, bound, new_file, live, limit)
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    self._live -= 1

        return release

    @staticmethod
    def _bound(share: int | None, new_file: bool) -> int | None:
        return new_file_share(share) if new_file else share

    @staticmethod
    def _refuse(path: str, bound: int, new_file: bool, live: int, limit: int) -> None:
        if new_file:
            message = (
                f"the store holds {live:,} maps, as many as new files may take ({bound:,}: seven eighths of its "
                f"share of the process's map areas, three quarters of vm.max_map_count, {limit:,}; the rest is for "
                "reading what is stored, and the host's)"
            )
            consequence = "no new segment or file is made (puts refused, as on a full disk); reads go on"
        else:
            message = (
                f"the store holds {live:,} maps, its whole share of the process's map areas ({bound:,}: three "
                f"quarters of vm.max_map_count, {limit:,}; the rest is the host's)"
            )
            consequence = "reads are answered 'could not be mapped now' until maps are given back"
        message += ": raise vm.max_map_count (RocketMQ's os.sh sets 655360), or use larger segments"
        mqstore_log.PROCESS_REPEATS.say(log, "error", "map_share_used_up", ("map_share_used_up", new_file), path=path,
                                        store_maps=live, max_map_count=limit, bound=bound, new_file=new_file,
                                        consequence=consequence)  # fmt: skip
        raise OSError(errno.ENOMEM, message, path)


    def forked(self) -> None:
        """In a child made by fork: a new lock (a parent's thread may have held this one, and
        a store the child opens would wait for it for good). The count stays: the child has
        the parent's maps too."""
        self._lock = threading.RLock()


# The process's one account: every store in it shares the host's map areas.
MAP_AREAS = MapAreas()
os.register_at_fork(after_in_child=lambda: MAP_AREAS.forked())
