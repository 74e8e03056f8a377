"""Consumer offsets as a store component (the broker's ConsumerOffsetManager, §11.10): committed
in memory, persisted by the supervisor's ticker (a tick hook, no thread of its own) every
CONSUMER_OFFSET_PERSIST_INTERVAL_MS of the monotonic ticker, and at close."""

from __future__ import annotations

import os
import threading

from .errors import StoreClosedError
from .log import get_logger
from .storage.consumer_offsets import DAMAGED_SUFFIX, ConsumerOffsetStore, OffsetsLoaded
from .storage.fs import FileSystem
from .storage.lockfiles import StoreDirectoryError, refuse_unless_regular_file
from .ticker import RealTicker, Ticker

__all__ = ["CONSUMER_OFFSET_PERSIST_INTERVAL_MS", "ConsumerOffsets"]

# The broker's flushConsumerOffsetInterval: committed offsets reach the disk this often.
CONSUMER_OFFSET_PERSIST_INTERVAL_MS = 5_000


class ConsumerOffsets:
    """Thread-safe: host threads commit and query, the supervisor's thread ticks."""

    def __init__(
        self, fs: FileSystem, root_dir: str, *, interval_ms: int = CONSUMER_OFFSET_PERSIST_INTERVAL_MS, ticker: Ticker | None = None
    ) -> None:
        self._fs = fs
        # The interval is the monotonic ticker's (the broker's scheduleAtFixedRate): counted on
        # the wall clock a tick carries, a clock stepped back by X held every commit in memory
        # for X more (review 108 F2: killed 35 s after a commit, it was lost).
        self._ticker: Ticker = ticker if ticker is not None else RealTicker()
        self._offsets = ConsumerOffsetStore(fs, root_dir)
        self._interval_ms = interval_ms
        self._lock = threading.Lock()  # the table's: commits and queries, a snapshot's copy
        # One write at a time, in the order of their snapshots; taken before `_lock`, never
        # under it: a commit never waits for a write (review 84 F4: a 100k-pair table's
        # write held commits and queries 0.6-1 s every 5 s).
        self._writing = threading.Lock()
        self._dirty = False
        self._next_persist_ms: int | None = None  # set by the first tick after a commit
        self._closed = False  # the last write was made (close): commits refused from then on
        self._kept = True  # what that last write said
        self.log = get_logger("mqstore.offsets", store=root_dir)

    def refuse_what_is_in_the_way(self) -> None:
        """StoreDirectoryError if a file stands where `config` belongs, or anything but a
        readable regular file where the offsets file, its `.bak`, `.tmp` or `.damaged` is: a
        directory, a FIFO (reading it hangs), a socket, a file this process may not read. The
        offsets are loaded only once the store is taken (under its lock), after recovery may
        have written; so what would fail that load is refused here, before any byte changes."""
        fs, path = self._fs, self._offsets.path
        directory = os.path.dirname(path)
        if fs.exists(directory) and not fs.isdir(directory):
            raise StoreDirectoryError(f"{directory} is a file where the store keeps its config directory; "
                                      "move it aside and start again")  # fmt: skip
        # .bak.tmp: the .bak is itself written through a temporary file.
        for candidate in (path, path + ".bak", path + ".tmp", path + ".bak.tmp", path + DAMAGED_SUFFIX):
            refuse_unless_regular_file(fs, candidate, "committed consumer offsets")
            if candidate.endswith((".json", ".bak")) and fs.exists(candidate):
                try:
                    fs.read_bytes(candidate)
                except OSError as exc:
                    raise StoreDirectoryError(f"{candidate} cannot be read ({exc.strerror or exc}): "
                                              "the committed consumer offsets would be lost") from exc  # fmt: skip

    def load(self) -> None:
        """Read config/consumerOffset.json (or its .bak); raises if neither parses."""
        with self._writing, self._lock:
            self._offsets.load()

    @property
    def loaded(self) -> OffsetsLoaded:
        """What the open found of the committed offsets (stats()["consumer_offsets_loaded"])."""
        return self._offsets.loaded

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """StoreClosedError once the offsets had their last write (the store closed, or its
        supervisor gave up): a commit after it would be kept nowhere."""
        with self._lock:
            if self._closed:
                raise StoreClosedError("the store has stopped: committed offsets are no longer kept")
            self._offsets.commit_offset(group, topic, queue_id, offset)
            self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        with self._lock:
            return self._offsets.query_offset(group, topic, queue_id)

    def persist(self) -> None:
        """Write the offsets now if any changed (string2File: .tmp, .bak, rename); OSError
        leaves them dirty, so the next tick or close retries. StoreClosedError once the last
        write was made (the store closed, or its supervisor gave up), saying whether it kept
        them: returning then would report as written offsets that may not be."""
        with self._writing:
            with self._lock:
                if self._closed:
                    kept = "were written then" if self._kept else "could not be written then: they are lost"
                    raise StoreClosedError(f"the store has stopped; its committed offsets {kept}")
            self._persist_writing()

    def _persist_writing(self, *, closing: bool = False) -> None:
        """(Holding `_writing`.) Copy the table if it changed, then write the copy without
        the table's lock. `closing`: no commit is taken after the copy (the close's)."""
        with self._lock:
            if not self._dirty or (self._closed and not closing):
                if closing:
                    self._closed = True
                return
            self._dirty = False
            snapshot = self._offsets.snapshot()
            if closing:
                self._closed = True
        try:
            self._offsets.persist(snapshot)
        except BaseException:  # not only OSError: whatever failed the write, it is still due
            with self._lock:
                self._dirty = True
            raise

    def __call__(self, wall_ms: int) -> None:
        """The tick hook: persist once `interval_ms` of the ticker passed since the first tick
        that saw a commit pending (the supervisor logs what this raises and ticks again). The
        wall time the tick carries is not used."""
        now_ms = self._ticker.now_ms()
        with self._lock:
            if not self._dirty or self._closed:
                self._next_persist_ms = None
                return
            if self._next_persist_ms is None:
                self._next_persist_ms = now_ms + self._interval_ms
            if now_ms < self._next_persist_ms:
                return
            self._next_persist_ms = None
        self.persist()

    def close(self) -> bool:
        """The last write, at the store's close or before its supervisor gives the lock up;
        False when it failed (logged: the close goes on, and reports the stop as not clean,
        since committed offsets were not kept). Later commits raise; a second call returns
        the first's answer."""
        with self._writing:
            with self._lock:
                if self._closed:
                    return self._kept
            try:
                self._persist_writing(closing=True)
            except Exception as exc:  # the close goes on (the store must stop): reported as not kept
                self.log.error("persisting consumer offsets at close failed", error=repr(exc))
                with self._lock:
                    self._kept = False
            return self._kept
