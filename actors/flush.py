"""Flush service and checkpoint owner (spec §7.1-§7.3, §7.5 checkpoint part, §11.1).

ASYNC_FLUSH: FlushRealTimeService, woken by puts and ticks, flushes once enough dirty pages
piled up, and thoroughly every `flush_commitlog_thorough_interval_ms`. SYNC_FLUSH:
GroupCommitService; requests that arrive while an fsync runs wait in the mailbox and are then
covered by that one fsync, which is the whole point of group commit.

The writer owns the segments; this actor maps them itself and msyncs its own mapping of the
same file, which forces the shared page-cache pages the writer dirtied. It owns `checkpoint`;
the ConsumeQueue and index actors report their timestamps to it.
"""

from __future__ import annotations

import errno
import os
import time
from typing import assert_never

from ..messages import (
    CommitLogAdvanced,
    ConsumeQueueFlushed,
    FlushAll,
    GroupCommitRequest,
    IndexFileFlushed,
    Ping,
    Pong,
    Tick,
)
from ..log import RepeatedLog, suppressed_fields
from ..storage.checkpoint import StoreCheckpoint
from ..storage.codec import segment_file_name
from ..storage.fs import OS_PAGE_SIZE, MappedRegion
from ..storage.status import PutMessageStatus
from .base import ActorContext, Periodic, StoreActor

__all__ = ["FlushCommitLogService"]


# What this actor takes; `handle` answers each with one reply type.
FlushRequest = CommitLogAdvanced | GroupCommitRequest | Tick | FlushAll | ConsumeQueueFlushed | IndexFileFlushed | Ping


class FlushCommitLogService(StoreActor[FlushRequest]):
    name = "flush"

    def __init__(
        self,
        ctx: ActorContext,
        *,
        flushed_offset: int,
        max_offset: int,
        store_timestamp: int,
        restarted: bool = False,
        degraded: bool = False,
    ) -> None:
        super().__init__(ctx)
        self._restarted = restarted
        # A missing or wrong-sized segment: puts refused and no byte changed, until the log
        # grows past where it ended at the start (the hole gone, say the cleaner deleted the
        # segment before it: puts are taken again, and the checkpoint must follow them, review
        # 106 H1).
        self._degraded_end = max_offset if degraded else None
        cfg = ctx.config
        self._segment_size = cfg.mapped_file_size_commitlog_bytes
        self._sync = cfg.flush_disk_type == "SYNC_FLUSH"
        self._flushed = flushed_offset
        self._max_offset = max_offset  # readable end the writer reported
        self._store_timestamp = store_timestamp  # of the newest record at or below _max_offset
        self._thorough = Periodic(ctx.ticker, cfg.flush_commitlog_thorough_interval_ms)
        self._pending: list[GroupCommitRequest] = []
        self._unmapped = RepeatedLog(ctx.ticker.now_ms)  # segments it could not map: a line a minute each
        # The last group commit forced its segment(s) through to the end: every byte appended
        # before it started (in page cache by then) is durable up to `_synced_through`.
        self._sync_started_ns = 0
        self._synced_through = 0
        self._regions: dict[int, MappedRegion] = {}
        self._checkpoint: StoreCheckpoint | None = None
        self._tail_missing = False  # the checkpoint's flushed offset lies in a deleted segment
        # Where an msync failed (None: none has). Nothing at or past it counts as flushed for
        # the rest of this actor's life: see _after_failed_flush.
        self._failed_at: int | None = None

    def on_start(self) -> None:
        self._failed_at = self.ctx.commitlog_flush_failed_at  # a restart forgets no failure
        self._checkpoint = StoreCheckpoint(self.ctx.fs, self.config.checkpoint_path)
        known = self._checkpoint.physic_flushed_offset
        if self._restarted and known is not None and self._flushed < known <= self._max_offset:
            # Durable below what the checkpoint says; above it the flush actor that died may
            # have left bytes unforced (review 42 G2): forced again from there, not from the
            # log's start the supervisor gives a restart (an open's recovery forced it all).
            self._flushed = known
        if known is not None and known > self._max_offset:
            # The log ends below what was flushed (its segment deleted, cut short, or replaced
            # by an older copy of itself; recovery never cuts below it): the writer stays
            # degraded until `mqstore recover`, and this offset is what tells the next open so;
            # kept as it is until then (lowered, the lost records would pass for a torn tail).
            self._tail_missing = True
        if not self._restarted and self._degraded_end is None and self._checkpoint.physic_flushed_offset != self._max_offset:
            # mqstore's own fields, before the writer takes a put (recovery forced the log): after
            # a crash they decide by the flushed offset. A checkpoint without them (a broker's)
            # is judged by its timestamps alone, which cannot tell this writer's unfinished put
            # (a zeroed header) from damage once the clock stepped back (review 102 H2), and a
            # broker's store opened here was judged so until this actor's first flush.
            self._flush_to(self._max_offset)
            self._write_checkpoint()

    def fail_request(self, message: object, error: Exception) -> None:
        """A group commit's put is stored whatever happened here: FLUSH_DISK_TIMEOUT (not
        known to be on disk), never the "not stored" a crash or a stop says of a request
        (review 141 F1: a retrying producer stored each twice)."""
        if isinstance(message, GroupCommitRequest):
            message.reply.send(message.result.with_status(PutMessageStatus.FLUSH_DISK_TIMEOUT, f"stored, not known to be on disk: {error}"))
        else:
            super().fail_request(message, error)

    def release(self) -> None:
        # Called on a crash and a stop: the group commits it waited on are owed an answer now
        # (the store's watch would give it only past their deadlines and its grace).
        pending, self._pending = self._pending, []
        for request in pending:
            try:
                self.fail_request(request, RuntimeError(f"{self.name} stopped before forcing the log past it"))
            except Exception as exc:  # its maps are closed below whatever an answer does
                self.log.error("a group commit's answer at the stop failed", error=repr(exc))
        for region in self._regions.values():
            region.close()
        self._regions.clear()
        if self._checkpoint is not None:
            self._checkpoint.close()
            self._checkpoint = None

    # messages ----------------------------------------------------------------------------
    def handle(self, message: FlushRequest) -> Pong | None:
        match message:
            case CommitLogAdvanced():
                newest = self.newest_of_queued(message, key=_max_offset)
                max_offset, ts = newest.max_offset, newest.store_timestamp
                if max_offset > self._max_offset:
                    self._max_offset = max_offset
                    self._store_timestamp = ts
                if not self._sync and not self.config.flush_commitlog_timed:
                    self._flush_if_due()
            case GroupCommitRequest():
                self._pending.append(message)
                self._group_commit()
            case Tick():
                if self._sync:
                    self._group_commit()
                    self._expire_pending()
                    if self._thorough.due():
                        # Group commits flush, but only this writes where they got to (review 41 N2).
                        self._write_checkpoint()
                else:
                    self._flush_if_due()
            case FlushAll(reply=reply, up_to=up_to, store_timestamp=up_to_ts):
                if up_to > self._max_offset:
                    self._max_offset = up_to
                    self._store_timestamp = max(self._store_timestamp, up_to_ts)
                self._flush_to(self._max_offset)
                self._answer_pending()
                self._write_checkpoint()
                reply.send(self._flushed)
            case ConsumeQueueFlushed(logics_msg_timestamp=ts, thorough=thorough, logics_flushed_offset=durable_below):
                assert self._checkpoint is not None
                if ts > 0 and not self.ctx.derived_flush_failed:  # (see ActorContext)
                    self._checkpoint.logics_msg_timestamp = ts
                    self._checkpoint.logics_flushed_offset = durable_below or None
                if thorough:
                    self._write_checkpoint()
            case IndexFileFlushed(index_msg_timestamp=ts):
                assert self._checkpoint is not None
                if not self.ctx.derived_flush_failed:  # (see ActorContext)
                    self._checkpoint.index_msg_timestamp = ts
                self._write_checkpoint()
            case Ping():
                return Pong()
            case _:
                assert_never(message)
        return None

    # async flush (§7.2) ------------------------------------------------------------------
    def _flush_if_due(self) -> None:
        least_pages = self.config.flush_commitlog_least_pages
        if self._thorough.due():
            least_pages = 0
        dirty_pages = self._max_offset // OS_PAGE_SIZE - self._flushed // OS_PAGE_SIZE
        crosses_segment = self._max_offset // self._segment_size != self._flushed // self._segment_size
        if (least_pages == 0 and self._max_offset > self._flushed) or dirty_pages >= max(least_pages, 1) or (
            crosses_segment and self._max_offset > self._flushed
        ):
            self._flush_to(self._max_offset)
            if least_pages == 0:
                # The flushed offset on disk is what tells the next open after a crash that
                # records below it were durable (records ending below it are a hole, never a
                # torn tail to cut): written every thorough flush, not only every CQ one (60 s).
                # (SYNC_FLUSH: on the tick, above.)
                self._write_checkpoint()

    # group commit (§7.3) -----------------------------------------------------------------
    def _group_commit(self) -> None:
        """Requests reach us one by one, but the writer keeps appending while we msync: so
        force whole segment tails (msync writes only the pages that are dirty) and let one
        msync cover every request whose bytes were appended before it started."""
        if not self._pending:
            return
        if self._failed_at is not None:
            self._refuse_past_failure()
            if not self._pending:
                return
        if not any(not self._covered(r) for r in self._pending):
            self._answer_pending()
            return
        newest = max(r.next_offset for r in self._pending)
        target = max(self._max_offset, newest)
        segment_end = (newest - 1) // self._segment_size * self._segment_size + self._segment_size
        started = time.monotonic_ns()
        if self._force_range(self._flushed, segment_end) and self._failed_at is None:
            self._sync_started_ns = started
            self._synced_through = segment_end
            # Only what was forced: the writer may already be in the next segment.
            self._flushed = max(self._flushed, min(target, segment_end))
            self._note_flushed()  # (it never was: SYNC_FLUSH's checkpoint had no flushed offset)
        elif self._failed_at is not None:
            self._refuse_past_failure()
        self._answer_pending()

    def _refuse_past_failure(self) -> None:
        """Sync puts whose bytes end past a failed msync: stored, never proven on disk."""
        assert self._failed_at is not None
        still: list[GroupCommitRequest] = []
        for request in self._pending:
            if request.next_offset > self._failed_at:
                request.reply.send(request.result.with_status(
                    PutMessageStatus.FLUSH_DISK_TIMEOUT,
                    f"a flush of the commitlog failed at offset {self._failed_at}: nothing past it counts as on disk "
                    "until the store is reopened"))  # fmt: skip
            else:
                still.append(request)
        self._pending = still

    def _covered(self, request: GroupCommitRequest) -> bool:
        return request.next_offset <= self._flushed or (
            request.appended_ns < self._sync_started_ns and request.next_offset <= self._synced_through
        )

    def _force_range(self, position: int, end: int) -> bool:
        """Force [position, end) segment by segment; False on an I/O error (nothing claimed)."""
        while position < end:
            segment = position - position % self._segment_size
            stop = min(end, segment + self._segment_size)
            if not self._force(segment, position, stop):
                return False
            position = stop
        return True

    def _force(self, segment: int, start: int, stop: int) -> bool:
        """msync [start, stop) of the segment at `segment`; True also when its file is gone
        (the cleaner removed it: nothing to force). False when it could not be mapped
        (`_map_failed`: retried later) or the msync failed (`_after_failed_flush`)."""
        try:
            region = self._region(segment)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.ENOMEM or self._cut_or_gone(segment):
                # Not "no memory for a map": a segment cut short (EINVAL past its end) is
                # never counted as forced through its file (review 72 M1).
                self._map_failed(segment, exc)
                return False
            return self._force_without_map(segment, start, stop, exc)
        try:
            self.ctx.faults.hit("flush.mid_fsync")
            region.flush(start - segment, stop - segment)
        except FileNotFoundError:
            self._regions.pop(segment, None)
        except OSError as exc:
            self._after_failed_flush(segment, start, exc)
            return False
        return True

    def _answer_pending(self) -> None:
        still: list[GroupCommitRequest] = []
        for request in self._pending:
            if self._covered(request):
                request.reply.send(request.result)
            else:
                still.append(request)
        self._pending = still

    def _expire_pending(self) -> None:
        now_ns = time.monotonic_ns()
        still: list[GroupCommitRequest] = []
        for request in self._pending:
            if now_ns >= request.deadline_ns:
                request.reply.send(request.result.with_status(PutMessageStatus.FLUSH_DISK_TIMEOUT, "flush too slow"))
            else:
                still.append(request)
        self._pending = still

    # the flush itself --------------------------------------------------------------------
    def _flush_to(self, target: int) -> None:
        """Force [flushed, target) to disk, segment by segment. An I/O error leaves `flushed`
        where it was: waiting sync puts then time out with FLUSH_DISK_TIMEOUT, as in Java."""
        target = max(target, self._flushed)
        if self._failed_at is not None:
            # What the log holds past a failed msync is still forced (the kernel writes what it
            # can), counted nowhere, from the failure on each time: its pages were dirtied again.
            self._force_range(self._failed_at, target)
            target = min(target, self._failed_at)
        while self._flushed < target:
            start = self._flushed
            segment = start - start % self._segment_size
            end = min(target, segment + self._segment_size)
            if not self._force(segment, start, end):
                return
            self._flushed = end
            if end == segment + self._segment_size:
                done = self._regions.pop(segment, None)
                if done is not None:
                    done.close()
        self._note_flushed()

    def _force_without_map(self, segment: int, start: int, stop: int, map_error: OSError) -> bool:
        """No map of the segment could be made (no memory or address space for one): forced
        through a descriptor instead (review 71 F4: under RLIMIT_AS every put was acknowledged
        and none ever forced, with nothing in the stats). A descriptor that cannot be had
        either is retried later (`_map_failed`); a failed fdatasync is a failed flush."""
        path = os.path.join(self.config.commitlog_dir, segment_file_name(segment))
        try:
            self.ctx.faults.hit("flush.mid_fsync")
            self.ctx.fs.sync_file(path, start - segment, stop - segment)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                self._map_failed(segment, map_error)
                return False
            self._after_failed_flush(segment, start, exc)
            return False
        suppressed = self._unmapped.admit(segment)
        if suppressed is not None:
            self.log.warning("commitlog segment forced through its file, not a map: no map could be made",
                             segment=segment, error=str(map_error), **suppressed_fields(suppressed))  # fmt: skip
        return True

    def _map_failed(self, segment: int, exc: OSError) -> None:
        """The segment could not be mapped (too many open files, no memory for a map): nothing
        was written or lost; the flushed offset stays, and the next flush tries again (review
        48 H1: it was taken for a failed msync, and every put refused until a reopen)."""
        suppressed = self._unmapped.admit(("map", segment))  # retried every few ms: not a line each (review 71 F6)
        if suppressed is not None:
            self.log.error("commitlog flush could not map its segment; tried again at the next flush", segment=segment,
                           error=str(exc), **suppressed_fields(suppressed))  # fmt: skip

    def _after_failed_flush(self, segment: int, start: int, exc: OSError) -> None:
        """A failed msync: Linux reports a failed writeback once and leaves its pages clean,
        bytes in memory only, so the retry at the next tick wrote nothing, succeeded, and the
        flushed offset (and checkpoint, and SYNC_FLUSH's PUT_OK) passed bytes never written
        (review 46 H1: 2,601 of 6,430 SYNC_FLUSH PUT_OKs lost after a thin volume ran out).
        No later msync proves those bytes written (on ext4 a failed unwritten-extent
        conversion keeps them unreadable after a remount whatever is written over them), so
        from the failure on nothing counts as flushed while this actor lives: the flushed
        offset and the checkpoint stay below it, sync puts past it are answered
        FLUSH_DISK_TIMEOUT, flush() raises, and the close is unclean. The pages are still
        dirtied again (every page from the flushed offset to the log's end in the segment:
        the failed one may be any written back since the last good msync), so the kernel
        writes them where it can."""
        if self._cut_or_gone(segment):
            # Another process cut the segment short or removed it: the writer's own checks
            # (the SIGBUS guard, replaced segments) name the file and refuse what it lost;
            # the disk itself did not fail.
            self.log.error("commitlog flush failed: the segment was cut short or removed under the store",
                           offset=start, error=str(exc))  # fmt: skip
            return
        failed_at = max(self._flushed, segment)
        if self._failed_at is None or failed_at < self._failed_at:
            self._failed_at = failed_at
            self.ctx.commitlog_flush_failed_at = failed_at  # the writer refuses puts from now on
            self.log.error("commitlog flush failed: nothing from here on counts as flushed until the store is reopened",
                           offset=failed_at, error=str(exc))  # fmt: skip
        else:  # the retries of a disk that stays failed: not a line per tick (review 49 L2)
            self.log.debug("commitlog flush failed again", offset=start, error=str(exc))
        lo = max(self._flushed, segment) - segment
        hi = min(max(self._max_offset, start), segment + self._segment_size) - segment
        try:
            self._region(segment).redirty(lo, max(hi, lo))
        except Exception as again:  # a map that cannot be made: dropped, made again next time
            self._regions.pop(segment, None)
            self.log.error("pages of a failed flush could not be dirtied again", segment=segment, error=repr(again))

    def _cut_or_gone(self, segment: int) -> bool:
        path = os.path.join(self.config.commitlog_dir, segment_file_name(segment))
        try:
            return self.ctx.fs.getsize(path) < self._segment_size
        except OSError:
            return True

    def _note_flushed(self) -> None:
        """The pair recovery needs after a power loss: durable below this offset, whose newest
        record is this timestamp (checkpoint module); written with the next checkpoint."""
        if self._checkpoint is not None and self._flushed >= self._max_offset and self._store_timestamp > 0 and not self._tail_missing:
            self._checkpoint.physic_msg_timestamp = self._store_timestamp
            self._checkpoint.physic_flushed_offset = self._flushed

    def _region(self, segment: int) -> MappedRegion:
        region = self._regions.get(segment)
        if region is None:
            path = os.path.join(self.config.commitlog_dir, segment_file_name(segment))
            region = self.ctx.fs.map_file(path, self._segment_size, create=False)
            self._regions[segment] = region
        return region

    def _write_checkpoint(self) -> None:
        # A degraded open changes no byte of the store: its checkpoint neither (review 105 G3,
        # G6: with a broker's, the queues' flushed offset was written at the close).
        if self._degraded_end is not None and self._max_offset > self._degraded_end:
            self._degraded_end = None  # puts were taken again
        if self._checkpoint is not None and self._degraded_end is None:
            try:
                self._checkpoint.flush()
            except OSError as exc:
                self.log.error("checkpoint flush failed", error=str(exc))


def _max_offset(advanced: CommitLogAdvanced) -> int:
    return advanced.max_offset
