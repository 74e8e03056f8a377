"""AllocateMappedFileService (spec §5): creates CommitLog segments ahead of the writer.

Each request names the segment needed now and the one after it; the needed one is usually
ready already (it was the previous request's next-next), so a roll-over costs the writer one
round trip and naming the file (a link and a directory fsync) instead of a file creation.
Handed-over files belong to the writer from then on.

Files are made ahead *unnamed* (O_TMPFILE) and the writer gives each its name when it takes
it (linkat: fails if the name exists). The allocator never names, opens or deletes a file by
a segment's name, so it cannot meet a segment the writer made itself while the allocator was
slow, paused or stopping: before, its release deleted by name the file a straggling writer
had made and was writing, and its late map of a name the writer had taken shared the
writer's file (review 78 H1). Where the filesystem has no unnamed files, nothing is made
ahead: the writer makes each segment itself. (Nor is the allocator restarted with the writer:
nothing of its can meet a restarted writer's recovery.)
"""

from __future__ import annotations

import errno
import heapq
import os
from dataclasses import dataclass, field
from typing import Any, assert_never

from ..log import RepeatedLog, suppressed_fields
from ..messages import (
    AllocateRequest,
    Ping,
    Pong,
    Reply,
)
from ..storage.mapped_file import MappedFile, parse_segment_offset
from ..storage.mapped_file_queue import REMEMBERED_CREATE_ERRNOS
from .base import ActorContext, StoreActor

__all__ = ["AllocateMappedFileService"]

MAX_ATTEMPTS_PER_FILE = 3  # a bound on I/O retries: after that the writer creates the file itself
# Why a filesystem cannot hold an unnamed file: no O_TMPFILE (EOPNOTSUPP; EISDIR before Linux
# 3.11; EINVAL from some FUSE), or /proc gone since the import (EOPNOTSUPP from
# fs._open_unnamed; the import itself needs /proc, psutil's memory figures).
NO_UNNAMED_FILES_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})
# (A refusal for want of permission is not retried: the next try fails alike until an operator
# acts, and the writer's queue remembers it: mapped_file_queue.REMEMBERED_CREATE_ERRNOS.)


@dataclass(order=True)
class _Pending:
    # Larger files first, then smaller start offsets (AllocateRequest.compareTo).
    sort_key: tuple[int, int]
    path: str = field(compare=False)
    file_size: int = field(compare=False)
    waiters: list[Reply[Any]] = field(default_factory=list, compare=False)
    mapped_file: MappedFile | None = field(default=None, compare=False)
    attempts: int = field(default=0, compare=False)


# What this actor takes; `handle` answers each with one reply type.
AllocatorRequest = AllocateRequest | Ping


class AllocateMappedFileService(StoreActor[AllocatorRequest]):
    name = "allocator"

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self._table: dict[str, _Pending] = {}
        self._queue: list[_Pending] = []
        # A failure repeats at the put rate while it lasts (review 65 F2: 2 lines per attempt,
        # 3 attempts for each of 2 paths per refused put): in full once, then a count.
        self._repeats = RepeatedLog(ctx.ticker.now_ms)
        self._cannot_make_unnamed: str | None = None  # why, once the filesystem said so

    def handle(self, message: AllocatorRequest) -> Pong | None:
        match message:
            case AllocateRequest():
                self._request(message)
            case Ping():
                return Pong()
            case _:
                assert_never(message)
        return None

    def _request(self, request: AllocateRequest) -> None:
        for path in (request.next_path, request.next_next_path):
            if path is not None and path not in self._table:
                pending = _Pending((-request.file_size, parse_segment_offset(path)), path, request.file_size)
                self._table[path] = pending
                heapq.heappush(self._queue, pending)
        needed = self._table[request.next_path]
        needed.waiters.append(request.reply)
        heapq.heappush(self._queue, needed)  # a pre-created next-next file left the heap unanswered
        self._work()

    def _work(self) -> None:
        while self._queue:
            pending = heapq.heappop(self._queue)
            if self._table.get(pending.path) is not pending:
                continue  # expired or superseded
            if pending.mapped_file is None:
                if self._cannot_make_unnamed is not None:
                    self._give_up(pending)
                    continue
                try:
                    pending.mapped_file = self._create(pending)
                except OSError as exc:
                    if exc.errno in NO_UNNAMED_FILES_ERRNOS:
                        self._cannot_make_unnamed = str(exc)
                        self.log.warning("no unnamed files on this filesystem: the writer makes each segment itself",
                                         path=pending.path, error=str(exc))  # fmt: skip
                        self._give_up(pending)
                        continue
                    pending.attempts += 1 if exc.errno not in REMEMBERED_CREATE_ERRNOS else MAX_ATTEMPTS_PER_FILE
                    suppressed = self._repeats.admit(("segment allocation failed", exc.errno))
                    if suppressed is not None:
                        self.log.warning("segment allocation failed", path=pending.path, error=str(exc),
                                         **suppressed_fields(suppressed))  # fmt: skip
                    if pending.attempts < MAX_ATTEMPTS_PER_FILE:
                        heapq.heappush(self._queue, pending)
                        continue
                    self._give_up(pending)
                    continue
            if pending.waiters:
                del self._table[pending.path]
                waiters, pending.waiters = pending.waiters, []
                waiters[0].send(pending.mapped_file)  # one writer: the first waiter owns it now
                for waiter in waiters[1:]:
                    waiter.send(None)

    def _give_up(self, pending: _Pending) -> None:
        """No file for `pending`: its waiters get None (the writer makes the segment itself)."""
        del self._table[pending.path]
        for waiter in pending.waiters:
            waiter.send(None)

    def _create(self, pending: _Pending) -> MappedFile:
        self.ctx.fs.makedirs(os.path.dirname(pending.path))
        mapped = MappedFile(self.ctx.fs, pending.path, pending.file_size, unnamed=True)
        self.ctx.faults.hit("allocator.mid_allocation")
        # No warm-up (warmMapedFileEnable has no effect here): when it outlasted the writer's
        # wait, the writer made this file itself and the warm-up wrote zeros over its records
        # (review 78 H1). The writer's reservation windows prefault what it writes instead.
        return mapped

    def release(self) -> None:
        # Shutdown gives back the files made ahead that nobody took (§5.3 deletes them by
        # name; here they never had one, so nothing on disk is touched).
        self._repeats.flush(self.log)
        now = self.ctx.clock_ms()
        for pending in self._table.values():
            if pending.mapped_file is not None:
                pending.mapped_file.destroy(1000, now)
            for waiter in pending.waiters:
                waiter.send(None)
        self._table.clear()
        self._queue.clear()
