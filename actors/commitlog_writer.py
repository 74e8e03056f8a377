"""The CommitLog writer: the only writer of commitlog/ (spec §6.4-§6.7).

Records arrive already encoded (the caller's thread did that, as RocketMQ builds the record
before taking its put lock); the writer assigns queue offsets, physical offsets and the store
timestamp, appends, and tells the flush and reput actors where the log now ends.
"""

from __future__ import annotations

import time
from collections import deque
from types import MappingProxyType
from typing import Any, Final, Protocol, assert_never, cast

import pykka

from ..read_view import NOT_THE_LOG, in_ranges, without_ranges
from ..runtime import tell_keeping_gil
from ..messages import (
    AllocateRequest,
    CommitLogAdvanced,
    CommitLogFilesDeleted,
    CommitWriteBuffers,
    DeleteExpiredCommitLogFiles,
    EncodedPut,
    GetCommitLogRecovery,
    GetLogFacts,
    GetWriterStatus,
    GroupCommitRequest,
    Ping,
    Pong,
    PutResult,
    RedeleteHangedCommitLogFile,
    RefusePutsOutside,
    STORED_STATUSES,
    RemoveQueuesFromTopicQueueTable,
    Reply,
    ResumeQueues,
    SetWriteable,
    Tick,
    WriterReady,
)
from ..config import ConfigError
from ..faults import NO_FAULTS
from ..log import RepeatedLog, suppressed_fields
from ..storage import codec, speedups
from ..storage.commitlog import CommitLog, EncodedRecords, Quarantined, store_copies, store_copy_problem, store_copy_starts
from ..storage.codec import END_FILE_MIN_BLANK_LENGTH, SCHEDULE_TOPIC
from ..storage.memory import memory_room
from ..storage.fs import OS_PAGE_SIZE, FileCutUnderMapError, FileReplacedUnderMapError
from ..storage.mapped_file import MappedFile, TransientStorePool
from ..storage.checkpoint import CheckpointValues
from ..storage.recovery import (
    CommitLogRecovery,
    LogFacts,
    RecoveryMode,
    log_facts_of,
    recover_commitlog,
    resume_queue_offsets,
)
from ..storage.status import PutMessageStatus
from .base import ActorContext, HeldWait, ServiceUnavailable, StoreActor

__all__ = ["CommitLogWriter", "DispatchLag", "PassReply", "PassSink"]

# A pass appends at most this many puts before it answers them and tells reput: bounds an
# answer's wait and the dispatch lag under a constant stream.
PASS_MAX_PUTS = 256
_NOT_WRITEABLE = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail="store not writeable")
_OK = PutMessageStatus.PUT_OK
# A stored put's PutResult is built as a tuple of every field in this order, without the
# NamedTuple's Python-level __new__ (0.23 us against 0.43 a put, once per put of a pass);
# tests/actors/test_writer_fast_append.py checks the order is PutResult's.
PUT_RESULT_FIELDS = ("status", "commitlog_offset", "wrote_bytes", "queue_offset", "msg_ids", "store_timestamp",
                     "msg_num", "detail")  # fmt: skip
_new_result = tuple.__new__
_BUSY = PutResult(status=PutMessageStatus.OS_PAGE_CACHE_BUSY, detail="write path busy")
_TOPIC_BEING_REMOVED = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=(
    "clean_unused_topic is removing this topic's queues: not stored; put again once it returned (the topic then "
    "starts new queues at offset 0)"))  # fmt: skip


class DispatchLag:
    """How many appended records dispatch has not written into the ConsumeQueues and the index
    yet, for put_msg_index_high_water. Dispatch publishes offsets, not counts, so the writer
    marks where each pass ended with the running count of records appended: the records done
    are those of the last mark at or below the offset dispatch reached. A pass dispatched in
    part counts as not dispatched, and past MARKS_MAX marks every second one is dropped: both
    can only overstate the lag, never hide it."""

    MARKS_MAX = 4096

    def __init__(self) -> None:
        self._marks: deque[tuple[int, int]] = deque()  # (end offset, records appended up to it)
        self._appended = 0
        self._done = 0  # records of the marks dispatch passed

    def appended(self, end_offset: int, records: int) -> None:
        self._appended += records
        self._marks.append((end_offset, self._appended))
        if len(self._marks) > self.MARKS_MAX:
            marks = list(self._marks)
            self._marks = deque(marks[len(marks) % 2 == 0 :: 2])  # the newest mark stays

    def behind(self, dispatched_offset: int) -> int:
        marks = self._marks
        while marks and marks[0][0] <= dispatched_offset:
            self._done = marks.popleft()[1]
        return self._appended - self._done


class PassSink(Protocol):
    """Takes a pass's answers of its PassReplies at once (in the writer's thread: it must be
    the store's own cheap code, never host code)."""

    def answer_pass(self, answers: list[tuple[PassReply, PutResult]]) -> None: ...


class PassReply(Reply[PutResult]):
    """A Reply the writer answers together with the others of its pass that share its `sink`:
    one call per pass instead of one per put (the pipelined puts: one wake-up of the
    completion thread, one in-flight release per pass). Any other path (a crash, a drain,
    a writer that is down, the supervisor expiring a group commit the flush actor may
    answer at the same time) answers it one by one through `send`/`fail`, as any Reply: a subclass's
    `send` must answer once when two threads call it."""

    __slots__ = ()

    # Where the pass's answers of this reply go: a slot of the subclass (read once per put).
    sink: PassSink


# What this actor takes; `handle` answers each with one reply type.
WriterRequest = (
    EncodedPut
    | Ping
    | GetWriterStatus
    | ResumeQueues
    | GetLogFacts
    | GetCommitLogRecovery
    | SetWriteable
    | CommitWriteBuffers
    | Tick
    | DeleteExpiredCommitLogFiles
    | RedeleteHangedCommitLogFile
    | RemoveQueuesFromTopicQueueTable
    | RefusePutsOutside
)


def _check_pool_fits_memory(buffers: int, segment_bytes: int) -> None:
    """ConfigError when the transient store pool (allocated whole at start, as in RocketMQ)
    would take more than the memory available now: the open refuses instead of leaving the
    host to a MemoryError or the OOM killer (review 35 F4; RocketMQ's default pool is 5 x 1 GiB)."""
    wanted = buffers * segment_bytes
    available = memory_room().available  # a container's limit, not only the host's (review 71 F1)
    if wanted > available:
        raise ConfigError("transient_store_pool_size", buffers,
                          f"{buffers} write buffers of mapped_file_size_commitlog_bytes={segment_bytes} take "
                          f"{wanted} bytes of memory, and {available} are available (the host's available "
                          f"memory, or the process's cgroup limit less its use)")  # fmt: skip


# How far behind the newest record's store time the clock may read and appends still get that
# record's time (`_store_time_ms`): NTP steps and a VM's clock put right are seconds to minutes.
STORE_TIME_HOLD_MAX_MS: Final = 10 * 60_000


class CommitLogWriter(StoreActor[WriterRequest]):
    name = "writer"

    def __init__(
        self,
        ctx: ActorContext,
        *,
        mode: RecoveryMode,
        checkpoint: CheckpointValues | None,
        store_host: codec.HostAddress,
    ) -> None:
        super().__init__(ctx)
        self._mode = mode
        self._checkpoint = checkpoint
        self._naming_failures = RepeatedLog(ctx.ticker.now_ms)
        self._recovered: CommitLogRecovery | None = None
        # Puts are refused until the queues' offsets are known (ResumeQueues, step two of a start).
        self._resumed = False
        self._store_host = store_host
        self._commitlog: CommitLog | None = None
        self._writeable = True
        self._closing = False
        self._sync_flush = ctx.config.flush_disk_type == "SYNC_FLUSH"
        # RocketMQ's check is `diff > osPageCacheBusyTimeOutMills` in whole milliseconds: busy
        # once a put has waited a millisecond past it. With 0, measured in ns, every put was
        # busy, however short its wait (review 103 L2).
        self._busy_timeout_ns = (ctx.config.os_page_cache_busy_timeout_ms + 1) * 1_000_000 - 1
        self._sync_timeout_ns = ctx.config.sync_flush_timeout_ms * 1_000_000
        # (wrote offset, store timestamp) of the newest append not yet told reput and flush:
        # a tuple per append, the notice itself built once per pass (_notify_advance).
        self._pending_advance: tuple[int, int] | None = None
        self._flush_told = 0  # the last log end the flush actor was told
        self._pooled = False
        # Puts appended and passes made, for the tests and the bench (puts per pass).
        self.passes = 0
        self.passed_puts = 0
        # put_msg_index_high_water: records appended and not yet dispatched, and how long puts
        # were held back for it (ms of the ticker).
        self._lag = DispatchLag()
        self._high_water = ctx.config.put_msg_index_high_water
        self.held_back_ms = 0
        self._holding_back = False
        self._reput_missed = False  # the last notice found no reput (see _notify_advance)
        self._replaced: PutResult | None = None  # the refusal once a segment was replaced
        self._replaced_copies_saved = True  # and whether the store's copy of each was saved
        # A restart found a segment it may not write (EPERM, EACCES: chattr +i, its mode or
        # owner): it runs degraded, reads served from what it loaded read-only, puts refused
        # with this, and the ticks map the segment for writing again (review 65 F3).
        self._not_writable: PutResult | None = None
        self._not_writable_held = HeldWait(self.log, "taking puts")
        self._zero_on_writable = 0  # the tail zeroing the load left for when it is writable
        self._stamp_floor_ms = 0  # the newest record's store time (`_store_time_ms`)
        self._clock_behind_since_ms = 0  # the clock read below it (logged once per episode)
        self._pass_first_file: MappedFile | None = None  # the segment a pass began in
        # Puts and records the current pass stored, counted where they are appended (so the
        # back-pressure check need not walk the pass's answers).
        self._stored_puts = 0
        self._stored_records = 0
        cfg = ctx.config
        self._index_enabled = cfg.message_index_enable
        self._segment_bytes = cfg.mapped_file_size_commitlog_bytes
        self._flush_least_pages = cfg.flush_commitlog_least_pages
        self._segments_published_for: MappedFile | None = None  # the newest segment at the last publication
        self._segments_published = False  # (by this writer: a restart's table is built anew)

    # lifecycle ---------------------------------------------------------------------------
    def on_start(self) -> None:
        cfg = self.config
        # TransientStorePool (§4.6): appends go to write buffers that the commit service's
        # ticks copy into the files. The pool is the writer's alone (it is not thread-safe),
        # so in this mode the writer creates its segments itself rather than through the
        # allocator. As in RocketMQ, acknowledged bytes not yet committed (at most
        # commit_interval_commitlog_ms) are lost if the writer or the process dies.
        if cfg.is_transient_store_pool_active and self._mode is not RecoveryMode.RESTART:
            _check_pool_fits_memory(cfg.transient_store_pool_size, cfg.mapped_file_size_commitlog_bytes)
        pool = None
        if cfg.is_transient_store_pool_active:
            try:
                pool = TransientStorePool(cfg.transient_store_pool_size, cfg.mapped_file_size_commitlog_bytes)
            except MemoryError as exc:  # a data limit (RLIMIT_DATA) the available memory does not show
                if self._mode is RecoveryMode.RESTART:
                    # The open allocated it: memory short now is a shortage the supervisor
                    # retries, not a setting to refuse (review 92: as a ConfigError each try
                    # counted, and ~4.5 s of it gave the store up for good).
                    raise
                raise ConfigError("transient_store_pool_size", cfg.transient_store_pool_size,
                                  f"{cfg.transient_store_pool_size} write buffers of mapped_file_size_commitlog_bytes="
                                  f"{cfg.mapped_file_size_commitlog_bytes} could not be allocated (MemoryError: the "
                                  f"process's data or address-space limit)") from exc  # fmt: skip
        self._pooled = pool is not None
        # This owner's part of recovery, the same on a first start and on every restart (the
        # mode says how far the files are trusted): it truncates a torn tail, quarantines damage.
        # At a restart the log was readable up to the read view's end: a segment cut or gone
        # below it (another process cut it under our map) is a hole, not the log's new end.
        restart = self._mode is RecoveryMode.RESTART
        known_end = self.ctx.read_view.view.readable_end if restart else 0
        # A restart may find a segment it may not write (review 65 F3: chattr +i under the
        # running store failed every restart with EPERM until the supervisor gave up, reads
        # and all): it loads it read-only and runs degraded. An open still refuses (nothing
        # is served yet, and the refusal names the file).
        # Beside a segment the previous writer found replaced, the file at its path is another
        # process's (an older backup, another store's segment): a tail cut in it is not this
        # log's torn put, so nothing is zeroed (puts are refused anyway). It zeroed what followed
        # another store's records there, bytes that were never the store's to change.
        copies = store_copies(self.ctx.fs, cfg.commitlog_dir) if restart else []
        beside_replaced = bool(copies or (restart and self.ctx.read_view.view.replaced))
        recovered = recover_commitlog(cfg, self.ctx.fs, mode=self._mode, checkpoint=self._checkpoint,
                                      clock_ms=self.ctx.clock_ms, known_end=known_end,
                                      readonly_if_denied=restart, zero_tail=not beside_replaced)  # fmt: skip
        self._commitlog = CommitLog(
            self.ctx.fs,
            cfg.commitlog_dir,
            mapped_file_size=cfg.mapped_file_size_commitlog_bytes,
            max_message_size=cfg.max_message_size_bytes,
            clock_ms=self.ctx.clock_ms,
            allocator=None if pool is not None else self._allocate,
            write_buffer_pool=pool,
            create_on_allocator_failure=True,
            check_crc_on_recover=cfg.check_crc_on_recover,
            fault_hook=self.ctx.faults.hit,
            # The one-frame append skips the fault points between its steps: only where none
            # can be armed (tests that arm one pass their own plan and keep the checked path).
            fast_append=self.ctx.faults is NO_FAULTS,
        )
        flushed = self._checkpoint.physic_flushed_offset if self._checkpoint is not None else None
        if flushed is not None or known_end:
            # Segments missing below what was flushed (or read, before a restart) were deleted:
            # a hole that keeps the log degraded (puts refused, reads served) until `mqstore
            # recover`, never an end that puts would continue from, reusing the lost records'
            # offsets.
            self._commitlog.mapped_file_queue.expected_end = max(flushed or 0, known_end)
        if not self._commitlog.load(readonly_if_denied=restart):
            raise RuntimeError(f"cannot load the commitlog in {cfg.commitlog_dir}: {self._commitlog.mapped_file_queue.load_error}")
        denied = self._commitlog.mapped_file_queue.not_writable
        if denied:
            # Zeroed once the segments are writable again (`_retry_writable`), as recover_tail
            # would have now: only the put the previous writer failed in can have left bytes.
            self._zero_on_writable = 0 if self._commitlog.mapped_file_queue.damaged_files else 2 * cfg.max_message_size_bytes
            self._refuse_not_writable(denied[0])
        if self._commitlog.mapped_file_queue.damaged_files or beside_replaced:
            # Degraded (puts refused until `mqstore recover`), perhaps read by a size the damage
            # left in doubt, or beside another process's file: placing the write positions
            # zeroes nothing (recovery did not either).
            self._commitlog.zero_tail_bytes = 0
        # The tail scan from the recovered end finds nothing: it places the write positions.
        end, _ = self._commitlog.recover_tail(recovered.facts.max_offset, {}, check_crc=False)
        self._recovered = recovered
        self._stamp_floor_ms = recovered.store_timestamp
        if copies:
            # The previous writer saved its copy of a segment another process replaced: the
            # file mapped now is not the store's, whatever its end (review 39 F2: restarted
            # before a tick, the refusal was undone and puts taken that moving the copy back,
            # as the refusal says, would have lost).
            self._replaced = PutResult(
                status=PutMessageStatus.SERVICE_NOT_AVAILABLE,
                detail=f"puts are refused until the store is closed: {store_copy_problem(copies[0])}",
            )
            starts = store_copy_starts(self.ctx.fs, cfg.commitlog_dir)
            self.ctx.read_view.add_replaced(tuple((start, start + self._segment_bytes) for start in starts))
        elif replaced := self.ctx.read_view.view.replaced:
            # The previous writer found segments replaced and could not save every copy (a full
            # disk): nothing on disk says so, but the store's view does (review 147 F1: the
            # restarted writer took puts again into a log that is not the store's).
            names = ", ".join("%020d" % start for start, _ in replaced)
            self._replaced = PutResult(
                status=PutMessageStatus.SERVICE_NOT_AVAILABLE,
                detail=f"commitlog segments {names} were replaced by another process while the store ran and the "
                       "store could not save its copy of every one: puts are refused until the store is closed",
            )  # fmt: skip
        elif known_end > end and not self._commitlog.mapped_file_queue.damaged_files and not recovered.quarantined:
            # Readers read up to known_end before this restart; the files now end below it
            # inside whole segments: one was replaced by an older copy (renamed over, renamed
            # away) under the previous writer. Appending here would give acknowledged
            # records' offsets to new ones.
            self._replaced = PutResult(
                status=PutMessageStatus.SERVICE_NOT_AVAILABLE,
                detail=f"the commitlog ends at {end}, below {known_end} where it was read before the writer "
                       "restarted: a segment was replaced by another process; puts are refused until the store "
                       "is closed and the segment (or its .store-copy) is back",
            )  # fmt: skip
            self.log.error("the commitlog ends below where it was read before the restart: puts refused",
                           end=end, read_up_to=known_end)  # fmt: skip
        if recovered.quarantined:
            # Damage the scan walked past: published before the readable end, so reput and
            # readers skip it (not only CRC, which covers the body alone). Not in a segment
            # replaced under the store: that damage is the other file's, and skipped as the
            # log's it moved consumers and dispatch past the records the store's copy holds
            # (review 149 F1: an older backup's missing tail, 182 acknowledged messages).
            damage = tuple((q.start, q.end) for q in recovered.quarantined)
            if damage := without_ranges(damage, self.ctx.read_view.view.replaced):
                self.ctx.read_view.add_quarantined(damage)
        self._publish_segments()
        self.ctx.read_view.publish_commitlog(self._readable_end())
        self.log.info("writer recovered", mode=self._mode.value, max_offset=end)

    def _publish_segments(self) -> None:
        """Before any of a segment new to the writer is readable (and at its start): the
        identity of every file it maps, so a reader mapping that path later maps the same
        file or reads "not now" (review 145 F3: in the moment before the writer's next check,
        a file renamed over the segment was read as the log). One compare when none is new."""
        commitlog = self._commitlog
        files = commitlog.mapped_file_queue.mapped_files if commitlog is not None else []
        newest = files[-1] if files else None
        if newest is self._segments_published_for:
            return
        self._segments_published_for = newest
        view = self.ctx.read_view.view
        known = view.segments if self._segments_published else {}
        segments = {f.file_from_offset: identity for f in files
                    if (identity := f.identity or known.get(f.file_from_offset)) is not None}  # fmt: skip
        # A writer restarted beside a replaced segment maps the other file there: no file at
        # that path is the log (review 149 F1: dispatch read it on as the log).
        for start in [f.file_from_offset for f in files if in_ranges(view.replaced, f.file_from_offset)]:
            segments[start] = NOT_THE_LOG
        self._segments_published = True
        self.ctx.read_view.publish_segments(MappingProxyType(segments))

    def _refuse_not_writable(self, error: OSError) -> None:
        self._not_writable = PutResult(
            status=PutMessageStatus.SERVICE_NOT_AVAILABLE,
            detail=f"a commitlog segment is not writable: {error} (an immutable or append-only attribute, or "
                   "permission); make it writable and puts resume without a restart; reads are served",
        )  # fmt: skip
        self._not_writable_held.failed(self.ctx.ticker.now_ms(), "a commitlog segment may not be written", str(error))

    def _retry_writable(self) -> None:
        """On the tick: map the segments loaded read-only for writing again; once all are,
        zero the tail the load left and take puts again."""
        commitlog = self._commitlog
        assert commitlog is not None and self._not_writable is not None
        queue = commitlog.mapped_file_queue
        with self._not_writable_held.quiet():
            for mapped_file in queue.mapped_files:
                if not mapped_file.readonly:
                    continue
                try:
                    mapped_file.map_writable()
                except FileReplacedUnderMapError:
                    self._check_segments_replaced(None)  # its copy saved from our map, puts refused
                    return
                except OSError as exc:
                    self._refuse_not_writable(exc)
                    return
        queue.not_writable = []
        commitlog.zero_tail_bytes = None
        end = commitlog.get_max_offset()
        queue.truncate_dirty_files(end, self._zero_on_writable)
        self._not_writable = None
        self._not_writable_held.ended(self.ctx.ticker.now_ms())

    def _resume_queues(self, request: ResumeQueues) -> WriterReady:
        """Step two of a start: continue each queue's offsets after every record in the log
        (the queues' units cover what lies below `dispatch_from`), and past the readable
        headers of quarantined records, so no queue offset is given out twice."""
        assert self._commitlog is not None and self._recovered is not None
        if self._resumed:
            # Its offsets run ahead of any queue snapshot (puts not dispatched yet): kept. (The
            # supervisor resumes the writer at each ConsumeQueue restart, for one that missed it.)
            return self._ready()
        known = [Quarantined(start, end, "quarantined") for start, end in self.ctx.read_view.view.quarantined]
        self._commitlog.topic_queue_table = resume_queue_offsets(
            self._commitlog, self._recovered, dict(request.topic_queue_table), request.dispatch_from, known,
            cleaned=request.cleaned,
        )
        self.ctx.read_view.publish_next_queue_offsets(self._commitlog.topic_queue_table)
        self._resumed = True
        self.log.info("writer ready", max_offset=self._commitlog.get_max_offset(),
                      queues=len(self._commitlog.topic_queue_table))  # fmt: skip
        return self._ready()

    def release(self) -> None:
        if self._commitlog is not None:
            # At a stop or a crash, before the maps go: a segment replaced since the last
            # check still has the store's bytes only in them.
            try:
                self._check_segments_replaced(None)
            except OSError as exc:
                self.log.error("could not check the commitlog segment before closing it", error=repr(exc))
            self._commitlog.close()
            self._commitlog = None

    # messages ----------------------------------------------------------------------------
    def handle(self, message: WriterRequest) -> WriterReady | LogFacts | CommitLogRecovery | Pong | int | None:
        try:
            return self._handle(message)
        finally:
            if self._pending_advance is not None and self.inbox_empty():
                self._notify_advance()

    def _handle(self, message: WriterRequest) -> WriterReady | LogFacts | CommitLogRecovery | Pong | int | None:
        match message:
            case EncodedPut():
                self._put_pass(message)
            case GetWriterStatus():
                return self._ready()
            case ResumeQueues():
                return self._resume_queues(message)
            case GetLogFacts():
                return self._log_facts()
            case GetCommitLogRecovery():
                assert self._recovered is not None
                return self._recovered
            case Ping():
                return Pong()
            case SetWriteable(writeable=writeable, closing=closing):
                self._writeable = writeable
                self._closing = self._closing or closing
                return self._ready()
            case CommitWriteBuffers(least_pages=least_pages):
                self._commit(least_pages)
            case Tick():
                # Idle too, and every segment, not only those a pass wrote: a segment replaced
                # between puts, or an older one, gets its copy saved now and the supervisor
                # hears of it (an unclean close), not only at the next put (~2 us a segment).
                # Before a not-writable segment is mapped again: a file swapped in meanwhile is
                # a replacement, not the segment made writable (review 66 F1).
                replaced = self._check_segments_replaced(None)
                if self._not_writable is not None and not replaced:
                    self._retry_writable()
                self._tell_flush_the_end()
                if self._reput_missed:
                    self._tell_reput_the_end()
            case DeleteExpiredCommitLogFiles():
                message.reply.send(self._delete_expired(message))
            case RedeleteHangedCommitLogFile(forcibly_ms=forcibly_ms, now_ms=now_ms, reply=reply):
                assert self._commitlog is not None
                deleted = self._commitlog.retry_delete_first_file(forcibly_ms, now_ms)
                reply.send(self._files_deleted(int(deleted)))
            case RemoveQueuesFromTopicQueueTable(queues=queues):
                assert self._commitlog is not None
                table = self._commitlog.topic_queue_table
                return sum(table.pop(f"{topic}-{queue_id}", None) is not None for topic, queue_id in queues)
            case RefusePutsOutside(keep=keep, until_ms=until_ms):
                self.ctx.puts_refused_outside = None if keep is None else (keep, until_ms)
                return self._readable_end()
            case _:
                assert_never(message)
        return None

    def _log_facts(self) -> LogFacts:
        assert self._commitlog is not None and self._recovered is not None
        facts = self._recovered.facts
        return log_facts_of(self._commitlog, self._commitlog.get_max_offset(), scan_start=facts.scan_start,
                            lost_ranges=facts.lost_ranges, quarantined=self.ctx.read_view.view.quarantined)  # fmt: skip

    def _ready(self) -> WriterReady:
        assert self._commitlog is not None
        return WriterReady(
            max_offset=self._readable_end(),
            wrote_offset=self._commitlog.get_max_wrote_offset(),
            # The head counts a segment cut short: the cleaner deletes queue and index files
            # below it, and those of a segment `recover` or a backup may still bring back.
            min_offset=self._commitlog.head_offset(),
            store_timestamp=self._commitlog.store_timestamp,
            topic_queue_table=dict(self._commitlog.topic_queue_table),
            degraded=bool(self._commitlog.degraded_reason),
        )

    def _put_pass(self, first: EncodedPut) -> None:
        """Append `first` and every put waiting behind it (at most PASS_MAX_PUTS) in one pass,
        then tell reput and flush once and hand all the answers out together: a wake-up of
        this thread, of reput and of each caller is paid per pass, not per put (RocketMQ's
        group commit does this for sync flush; here async flush gets it too)."""
        puts = [first]
        puts.extend(self.take_all_queued(EncodedPut, PASS_MAX_PUTS - 1))
        assert self._commitlog is not None
        self._pass_first_file = self._commitlog.mapped_file_queue.last_mapped_file
        answers: list[tuple[Reply[PutResult], PutResult]] = []
        group_commits: list[GroupCommitRequest] = []
        self._stored_puts = self._stored_records = 0
        in_files = not self._pooled  # the appended bytes are in the segments' maps (not a write buffer)
        try:
            for unit in self._units(puts, answers):
                if len(unit) == 1:
                    self._append(unit[0], answers, group_commits)
                else:
                    self._append_group(unit, answers, group_commits)
            if self._stored_puts and self._pooled:
                self._commit_pass()
            in_files = True
            # A segment cut short by another process took the pass's bytes into memory (the
            # SIGBUS guard's zero pages), not into the file: no put of it is answered stored.
            # The writer fails; its restart reads the cut segment as the damage it is.
            assert self._commitlog is not None
            self._commitlog.raise_if_cut(writing=True)
        except BaseException as exc:
            if not in_files and self._stored_puts:
                # With write buffers, copy what the pass appended into the files before the
                # writer fails: a pass that ran out of buffers wrote its later segments straight
                # into their maps, and the earlier segments' bytes left behind were a hole
                # before them (review 128 F1: the restart carried on past it, queue offsets were
                # handed out twice, and a kill -9 then cut the log at the hole, PUT_OKs with it).
                try:
                    self._commit_pass()
                    in_files = True
                except BaseException as commit_failed:  # (the hole stays: said in the log)
                    self.log.error("a failed pass's write buffers could not be committed", error=repr(commit_failed))
            if self._stored_puts and in_files:
                # Its segments checked as a pass that succeeds checks them: one deleted or
                # renamed away before it rolled to the next is older than the newest by the
                # time release() checks, which takes that for space freed by hand (review 142
                # F2: its acknowledged puts were in no file, no copy was saved, the close was
                # clean). The copy is saved, and the pass answered as one that found it.
                try:
                    self._refuse_if_segment_replaced(answers, group_commits)
                except Exception as check_failed:
                    self.log.error("a failed pass's segments could not be checked", error=repr(check_failed))
            # The puts of this pass are out of the inbox, so the crash handler cannot see them.
            self._answer_failed_pass(puts, answers, group_commits, exc, stored=in_files and not isinstance(exc, FileCutUnderMapError))
            # Not published: readers and the restart's known end must not count bytes no put
            # was acknowledged for (review 65 F3: a refused record's end, 6321, taken for
            # where the log was read made the restarted writer refuse puts for good).
            self._pending_advance = None
            raise
        if self._stored_puts:
            self._refuse_if_segment_replaced(answers, group_commits)
        self.passes += 1
        self.passed_puts += len(puts)
        if self._stored_puts:
            self._hold_back(self._stored_puts, self._stored_records)
        if self._stored_puts and self._replaced is None:
            # Before any caller can hear of them (a group commit's answer comes from the flush
            # actor: review 105 G2).
            self.ctx.read_view.publish_acked(self._readable_end())
        if group_commits:
            self._notify_advance()  # the flush actor must know the data it is asked to force
            for request in group_commits:
                if not self.ctx.tell("flush", request):
                    request.reply.send(request.result.with_status(PutMessageStatus.FLUSH_DISK_TIMEOUT, "flush service down"))
                else:  # (and its answer watched: a flush stuck in an msync is answered for)
                    self.ctx.group_commits.add(request)
            self.ctx.group_commits.drop_answered()
        # Answers of PassReplies go to their sinks as they are (the tuple reused, not rebuilt).
        by_sink: dict[int, tuple[PassSink, list[tuple[Reply[PutResult], PutResult]]]] = {}
        wakes: list[Any] = []
        last_sink: PassSink | None = None
        sunk: list[tuple[Reply[PutResult], PutResult]] = []
        for answer in answers:
            reply = answer[0]
            if isinstance(reply, PassReply):
                # Answered by its sink from here on: a failure later in this pass (the crash
                # handler fails the pass's first put) must not answer it again (review 115 F4:
                # SERVICE_NOT_AVAILABLE after PUT_OK, a retrying client stored it twice).
                reply._done = True
                sink = reply.sink
                if sink is not last_sink:  # a pass's answers mostly share one sink
                    entry = by_sink.get(id(sink))
                    if entry is None:
                        by_sink[id(sink)] = entry = (sink, [])
                    last_sink, sunk = sink, entry[1]
                sunk.append(answer)
                continue
            # The waiting callers are woken together after the loop, without the GIL (post_all):
            # a post that held it, the woken caller preempting the writer on its CPU, found it
            # held and slept again (py-spy: 42% of the GIL's time, 4 put threads, was the
            # writer in sem_post).
            result = answer[1]
            try:
                reply.send(result, posts=wakes)
            except Exception as exc:  # a Reply to a dead actor, a raising callback: theirs, not ours
                self.log.warning("a put's answer could not be delivered", status=result.status.name, error=repr(exc))
        if wakes:  # (filled only with the C extension's signals)
            native = speedups.native
            assert native is not None
            native.post_all(wakes)
        for sink, sunk in by_sink.values():
            try:
                sink.answer_pass(cast("list[tuple[PassReply, PutResult]]", sunk))  # each reply a PassReply (above)
            except Exception as exc:  # the pipeline's own code; never worth the writer
                self.log.error("a pass's answers could not be handed over", puts=len(sunk), error=repr(exc))
        self._notify_advance()

    def _refuse_if_segment_replaced(
        self, answers: list[tuple[Reply[PutResult], PutResult]], group_commits: list[GroupCommitRequest]
    ) -> None:
        """The segment being written is not the file at its path any more (another process
        renamed one over it, or deleted it): the pass's bytes went to a file no directory
        holds, lost at the next open unless the owner moves back the store's copy of the
        segment, saved beside it (CommitLog.keep_replaced_segments). No later put is taken,
        and the close is unclean (the supervisor hears of it). The pass's own puts are in
        that copy, dispatched like the rest and served once it is moved back: answered
        FLUSH_DISK_TIMEOUT (stored, not known to be on disk where the store opens from), not
        "not stored", which had a retrying producer store each twice (review 141 F2). Where
        a copy could not be saved they are in no file: refused."""
        if self._replaced is None and not self._check_segments_replaced(self._pass_first_file):
            return
        refusal = self._replaced
        assert refusal is not None
        detail = f"stored only in the store's copy of a segment: {refusal.detail}"

        def answer(stored: PutResult) -> PutResult:
            if not self._replaced_copies_saved:
                return refusal
            return stored.with_status(PutMessageStatus.FLUSH_DISK_TIMEOUT, detail)

        answers[:] = [(reply, answer(result) if result.status is _OK else result) for reply, result in answers]
        answers.extend((request.reply, answer(request.result)) for request in group_commits)
        group_commits.clear()

    def _check_segments_replaced(self, since: MappedFile | None) -> bool:
        """True (and every later put refused) once a segment written since `since` is not
        the file at its path any more; its copy is saved (CommitLog.keep_replaced_segments).
        Checked again after the first: a second segment replaced later, or a copy that could
        not be saved, is found and saved as the first was (review 146 F1: it was never looked
        at again, and its acknowledged messages were lost at the next open)."""
        if self._commitlog is None:
            return self._replaced is not None
        found = self._commitlog.keep_replaced_segments(since)
        if found is None:
            return self._replaced is not None
        detail, all_saved, starts = found
        if self._replaced is None:
            self._replaced_copies_saved = all_saved  # (the answer of the pass that found it)
            self._replaced = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=detail)
        else:  # a later segment, or a copy saved on a retry (review 147 F3: still said "could not be saved")
            self._replaced = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                       detail=f"{self._replaced.detail}; then {detail}")  # fmt: skip
        # Readers stop there: the file at the path is not the log (review 145 F2: another
        # store's segment of the same shape was served as this one's messages).
        self.ctx.read_view.add_replaced(tuple((start, start + self._segment_bytes) for start in starts))
        return True

    def _hold_back(self, stored_puts: int, stored_records: int) -> None:
        """put_msg_index_high_water, RocketMQ's dispatch back-pressure (3.x's DispatchMessageService
        .putRequest; 4.4.0 kept the setting and dropped its use): while more records than the
        high water are appended but not yet in the ConsumeQueues and the index, each put of
        the pass holds the writer 1 ms before it is answered, as Java's put slept 1 ms holding
        the put lock. Puts stay stored; callers wait longer, and one that waited past
        os_page_cache_busy_timeout_ms in the inbox is answered OS_PAGE_CACHE_BUSY, unstored."""
        pending = self._pending_advance
        assert pending is not None and self._commitlog is not None  # set by every append that stored
        # The log's end: without write buffers, where this pass's last append ended.
        self._lag.appended(self._commitlog.get_max_offset() if self._pooled else pending[0], stored_records)
        if not self._holding_back and self._lag.behind(self._dispatched_offset()) <= self._high_water:
            return  # every pass but under back-pressure
        held = behind = 0
        for _ in range(stored_puts):
            behind = self._lag.behind(self._dispatched_offset())
            if behind <= self._high_water:
                break
            if not self._holding_back:
                self._holding_back = True
                self.log.warning("dispatch is behind the high water: puts are held back", behind_records=behind,
                                 high_water=self._high_water)  # fmt: skip
            if held == 0:
                # Reput hears of this pass's records now, not after the hold: they count in the
                # lag, and Java's dispatcher had them queued while the put slept.
                self._notify_advance()
            self.ctx.ticker.sleep_ms(1)
            held += 1
        self.held_back_ms += held
        if self._holding_back and behind <= self._high_water:
            self._holding_back = False
            self.log.info("dispatch is below the high water again", behind_records=behind, high_water=self._high_water)

    def _dispatched_offset(self) -> int:
        """Below this commitlog offset every record is in the ConsumeQueues and (if enabled) the index."""
        view = self.ctx.read_view.view
        if self._index_enabled:
            return min(view.queues_written, view.indexed_end)
        return view.queues_written

    def _units(self, puts: list[EncodedPut], answers: list[tuple[Reply[PutResult], PutResult]]) -> list[list[EncodedPut]]:
        """The pass's puts to append, refused ones answered: single records of one queue
        grouped (in their order, where the queue's first one stood) for one append each,
        the rest alone. Each queue keeps its puts' order; puts to different queues that are
        in flight together have no order between them, as with any concurrent callers."""
        if self._closing or not self._writeable or not self._resumed:
            answers.extend((put.reply, _NOT_WRITEABLE) for put in puts)
            return []
        if self._replaced is not None:
            answers.extend((put.reply, self._replaced) for put in puts)
            return []
        if self._not_writable is not None:
            answers.extend((put.reply, self._not_writable) for put in puts)
            return []
        if self.ctx.commitlog_flush_failed_at is not None:
            # The disk failed a flush: what is acknowledged from now on could never be proven
            # on disk in this run (review 46 M1: ASYNC acknowledged for seconds, then lost).
            refusal = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=(
                f"a flush of the commitlog failed at offset {self.ctx.commitlog_flush_failed_at} (see the log): no "
                "put is taken until the store is closed and opened again, once the disk is sound"))  # fmt: skip
            answers.extend((put.reply, refusal) for put in puts)
            return []
        refused = self.ctx.puts_refused_outside  # (clean_unused_topic running)
        if refused is not None:
            if self.ctx.ticker.now_ms() < refused[1]:
                puts = self._refuse_removed_topics(refused[0], puts, answers)
            else:
                self.ctx.puts_refused_outside = None
        # RocketMQ rejects a put while another has held the put lock too long; the actor's
        # equivalent is a request that waited in the mailbox too long behind slow appends.
        oldest_ns = time.monotonic_ns() - self._busy_timeout_ns
        if len(puts) == 1:  # a pass of one put (single puts from one thread)
            if puts[0].enqueued_ns < oldest_ns:
                answers.append((puts[0].reply, _BUSY))
                return []
            return [puts]
        units: list[list[EncodedPut]] = []
        singles: dict[tuple[str, int], list[EncodedPut]] = {}
        for put in puts:
            if put.enqueued_ns < oldest_ns:
                answers.append((put.reply, _BUSY))
            elif put.batch or put.sys_flag or len(put.records) != 1:
                singles.pop((put.topic, put.queue_id), None)  # later singles go after it
                units.append([put])
            else:
                group = singles.get((put.topic, put.queue_id))
                if group is None:
                    singles[(put.topic, put.queue_id)] = group = []
                    units.append(group)
                group.append(put)
        return units

    @staticmethod
    def _refuse_removed_topics(
        kept: frozenset[str], puts: list[EncodedPut], answers: list[tuple[Reply[PutResult], PutResult]]
    ) -> list[EncodedPut]:
        """The puts to topics clean_unused_topic keeps; the others answered refused, unstored."""
        taken = []
        for put in puts:
            if put.topic in kept or put.topic == SCHEDULE_TOPIC:
                taken.append(put)
            else:
                answers.append((put.reply, _TOPIC_BEING_REMOVED))
        return taken

    def _append_group(
        self, group: list[EncodedPut], answers: list[tuple[Reply[PutResult], PutResult]], group_commits: list[GroupCommitRequest]
    ) -> None:
        """Single puts of one queue appended together: one contiguous run of records (as a
        batch is: consecutive queue offsets, one C call, the first header written last), each
        answered with its own offsets and msgId. Split where a run would pass the size a
        batch may have."""
        commitlog = self._commitlog
        assert commitlog is not None
        limit = min(commitlog.max_message_size, commitlog.mapped_file_size - END_FILE_MIN_BLANK_LENGTH)
        all_datas = [p.records[0] for p in group]
        runs: list[tuple[list[EncodedPut], tuple[bytes, ...]]]
        if sum(map(len, all_datas)) <= limit:
            runs = [(group, tuple(all_datas))]  # the common case: one run
        else:
            runs = []
            start = 0
            while start < len(group):
                end, total = start, 0
                while end < len(group) and (end == start or total + len(all_datas[end]) <= limit):
                    total += len(all_datas[end])
                    end += 1
                runs.append((group[start:end], tuple(all_datas[start:end])))
                start = end
        for chunk, datas in runs:
            if len(chunk) == 1:
                self._append(chunk[0], answers, group_commits)
                continue
            first = chunk[0]
            now = self._store_time_ms()
            fast = commitlog.append_fast(datas, f"{first.topic}-{first.queue_id}", 0, self._store_host, now)
            if fast is not None:
                self._answer_run(chunk, fast[0], fast[2], fast[3].split(","), now, answers, group_commits)
                self._pending_advance = (fast[0] + fast[1], now)
                continue
            # Not a plain copy (a reservation to top up, write buffers, the checked path, the
            # segment's end): the part of the run the last segment takes as one append, the
            # rest put by put, placed as single puts are. Appended as one unit, a run that did
            # not fit rolled over whole and left blank the room its first records fit, and
            # where single puts landed depended on how they had met in the inbox.
            room, fits = commitlog.room_in_last_file(), 0
            for data in datas:
                if len(data) > room:
                    break
                room -= len(data)
                fits += 1
            if fits > 1:
                self._append_run(chunk[:fits], datas[:fits], answers, group_commits)
                chunk = chunk[fits:]
            for put in chunk:
                self._append(put, answers, group_commits)

    def _append_run(
        self,
        chunk: list[EncodedPut],
        datas: tuple[bytes, ...],
        answers: list[tuple[Reply[PutResult], PutResult]],
        group_commits: list[GroupCommitRequest],
    ) -> None:
        """Single puts of one queue that fit the last segment, appended through the checked
        path as one run."""
        commitlog = self._commitlog
        assert commitlog is not None
        first = chunk[0]
        now = self._store_time_ms()
        records = EncodedRecords(datas, first.topic, first.queue_id, 0, self._store_host)
        outcome = commitlog.put_messages(records, now)
        append = outcome.append_result
        if outcome.status is not PutMessageStatus.PUT_OK or append is None:
            detail = outcome.detail or (append.status.value if append is not None else "")
            refused = PutResult(status=outcome.status, detail=detail)
            answers.extend((p.reply, refused) for p in chunk)
            self.ctx.faults.hit("writer.after_refusal")
            return
        self.ctx.faults.hit("writer.after_append")
        self._answer_run(chunk, append.wrote_offset, append.logics_offset, append.msg_id.split(","),
                         append.store_timestamp, answers, group_commits)  # fmt: skip
        self._advanced(append.wrote_offset + append.wrote_bytes, append.store_timestamp)

    def _answer_run(
        self,
        chunk: list[EncodedPut],
        offset: int,
        queue_offset: int,
        ids: list[str],
        store_timestamp: int,
        answers: list[tuple[Reply[PutResult], PutResult]],
        group_commits: list[GroupCommitRequest],
    ) -> None:
        """Each put of a run appended together answered with its own offsets and msgId."""
        self._stored_puts += len(chunk)
        self._stored_records += len(chunk)
        sync = self._sync_flush
        ok = _OK
        for k, put in enumerate(chunk):
            size = len(put.records[0])
            result: PutResult = _new_result(PutResult, (ok, offset, size, queue_offset + k, (ids[k],), store_timestamp, 1, ""))
            offset += size
            if sync:
                self._answer_stored(put, result, answers, group_commits)
            else:
                answers.append((put.reply, result))

    def _answer_stored(
        self, put: EncodedPut, result: PutResult, answers: list[tuple[Reply[PutResult], PutResult]], group_commits: list[GroupCommitRequest]
    ) -> None:
        """A stored put's answer: now, or (sync flush) once the flush actor covered it."""
        if self._sync_flush and put.sync_wait:
            now_ns = time.monotonic_ns()
            group_commits.append(
                GroupCommitRequest(
                    next_offset=result.commitlog_offset + result.wrote_bytes,
                    result=result,
                    reply=put.reply,
                    deadline_ns=now_ns + self._sync_timeout_ns,
                    appended_ns=now_ns,
                )
            )
        else:
            answers.append((put.reply, result))

    def _advanced(self, wrote_offset: int, store_timestamp: int) -> None:
        self._pending_advance = (wrote_offset, store_timestamp)

    def _store_time_ms(self) -> int:
        """The next append's store time: the clock, but not below the newest record's while the
        clock reads less than STORE_TIME_HOLD_MAX_MS earlier (a small step back, a VM's clock
        put right): the index orders its files and answers time ranges by store times rising
        along the log (review 57 F5, F6). Further behind, the clock is followed again: one
        reading far ahead would otherwise pin every later store time until the clock caught
        up, years perhaps (review 59 M1). Crash recovery does not rely on either: it starts no
        later than the checkpoint's forced offsets (review 57 F1)."""
        now = self.ctx.clock_ms()
        floor = self._stamp_floor_ms
        if now >= floor or floor - now > STORE_TIME_HOLD_MAX_MS:
            if now < floor:
                self.log.warning("the clock reads far earlier than the newest record's store time: store times "
                                 "follow the clock back", clock_ms=now, newest_store_time_ms=floor)  # fmt: skip
            elif self._clock_behind_since_ms:
                self.log.warning("the clock has passed the newest store time again; store times follow it",
                                 held_ms=now - self._clock_behind_since_ms)  # fmt: skip
            self._clock_behind_since_ms = 0
            self._stamp_floor_ms = now
            return now
        if not self._clock_behind_since_ms:
            self._clock_behind_since_ms = floor
            self.log.warning("the clock reads earlier than the newest record's store time (stepped back?): "
                             "store times are held at that record's until the clock passes it",
                             clock_ms=now, newest_store_time_ms=floor)  # fmt: skip
        return floor

    def _answer_failed_pass(
        self, puts: list[EncodedPut], answers: list[tuple[Reply[PutResult], PutResult]],
        group_commits: list[GroupCommitRequest], exc: BaseException, *, stored: bool,
    ) -> None:  # fmt: skip
        """Answer every put of a pass that failed midway. Those appended before the failure are
        in the segments' maps, which the restart's recovery reads (`stored`): answered as
        stored, a sync flush's FLUSH_DISK_TIMEOUT as it was never asked (review 124 F3: they
        were answered SERVICE_NOT_AVAILABLE and served, and a retrying producer stored each
        twice). Refusals made in the pass keep their own answer; the rest, the put the
        failure hit among them (its bytes may be in), learn that the writer failed. Bytes in a
        write buffer not committed, or in a segment cut under its map, reached no file."""
        answered: set[int] = set()
        if stored:
            # Before any caller hears of them, as a pass that succeeds publishes its end
            # (review 128 F6: a read told right after such a PUT_OK did not wait for it).
            ends = [r.commitlog_offset + r.wrote_bytes for _, r in answers if r.status in STORED_STATUSES]
            ends.extend(q.result.commitlog_offset + q.result.wrote_bytes for q in group_commits)
            if ends:
                self.ctx.read_view.publish_acked(max(ends))
        for reply, result in answers:
            if stored or result.status not in STORED_STATUSES:
                reply.send(result)
                answered.add(id(reply))
        if stored:
            for request in group_commits:
                request.reply.send(request.result.with_status(
                    PutMessageStatus.FLUSH_DISK_TIMEOUT,
                    f"stored, not known to be on disk: the writer failed before its flush ({exc!r})"))  # fmt: skip
                answered.add(id(request.reply))
        failure = ServiceUnavailable(f"{self.name} failed: {exc!r}")
        for put in puts:
            if id(put.reply) not in answered:
                put.reply.fail(failure)

    def _append(self, put: EncodedPut, answers: list[tuple[Reply[PutResult], PutResult]], group_commits: list[GroupCommitRequest]) -> None:
        """Append one put of a pass; its answer goes to `answers`, or (sync flush) its group
        commit request to `group_commits`."""
        commitlog = self._commitlog
        assert commitlog is not None
        now = self._store_time_ms()
        datas = put.records
        fast = commitlog.append_fast(datas, f"{put.topic}-{put.queue_id}", put.sys_flag, self._store_host, now)
        if fast is not None:
            offset, size, queue_offset, joined_ids = fast
            n = len(datas)
            msg_ids = (joined_ids,) if n == 1 else tuple(joined_ids.split(","))
            result: PutResult = _new_result(PutResult, (_OK, offset, size, queue_offset, msg_ids, now, n, ""))
            self._pending_advance = (offset + size, now)
            self._stored_puts += 1
            self._stored_records += n
            if self._sync_flush:
                self._answer_stored(put, result, answers, group_commits)
            else:
                answers.append((put.reply, result))
            return
        records = EncodedRecords(datas, put.topic, put.queue_id, put.sys_flag, self._store_host)
        outcome = commitlog.put_messages(records, now) if put.batch else commitlog.put_message(records, now)
        append = outcome.append_result
        if outcome.status is not PutMessageStatus.PUT_OK or append is None:
            detail = outcome.detail or (append.status.value if append is not None else "")
            answers.append((put.reply, PutResult(status=outcome.status, detail=detail)))
            self.ctx.faults.hit("writer.after_refusal")
            return
        self.ctx.faults.hit("writer.after_append")
        ids = tuple(append.msg_id.split(",")) if append.msg_id else ()
        result = PutResult(
            status=PutMessageStatus.PUT_OK,
            commitlog_offset=append.wrote_offset,
            wrote_bytes=append.wrote_bytes,
            queue_offset=append.logics_offset,
            msg_ids=ids,
            store_timestamp=append.store_timestamp,
            msg_num=append.msg_num,
        )
        self._advanced(append.wrote_offset + append.wrote_bytes, append.store_timestamp)
        self._stored_puts += 1
        self._stored_records += append.msg_num
        self._answer_stored(put, result, answers, group_commits)

    def _notify_advance(self) -> None:
        self._publish_segments()
        pending = self._pending_advance
        if pending is None:
            return
        # The readable end now, not when the put was appended: with write buffers a commit
        # may have moved it since and told reput already; a lower notice after that one
        # would be the newest in reput's inbox and hide it (a put stayed invisible).
        advanced = CommitLogAdvanced(
            max_offset=self._readable_end(), wrote_offset=pending[0], store_timestamp=pending[1]
        )
        self._pending_advance = None
        self.ctx.read_view.publish_commitlog(advanced.max_offset)
        # Reput down (being restarted): its successor learns the end from our Ping at its
        # start, but a put appended between that Ping and its registration would be told to
        # nobody and stay undispatched until the next put. The next tick tells it again.
        self._reput_missed = not self._notice("reput", advanced)
        # Async flush acts only once flush_commitlog_least_pages dirty pages piled up (its own
        # tick does the thorough flush): waking it for less is a thread switch for nothing.
        # Sync flush (group commit) and segment ends always need to know.
        page = OS_PAGE_SIZE
        dirty_pages = advanced.max_offset // page - self._flush_told // page
        segment = self._segment_bytes
        crossed_segment = advanced.max_offset // segment != self._flush_told // segment
        if self._sync_flush or dirty_pages >= self._flush_least_pages or crossed_segment:
            self._flush_told = advanced.max_offset
            self._notice("flush", advanced)

    def _notice(self, peer: str, message: CommitLogAdvanced) -> bool:
        """Tell a peer where the log ends without handing it the GIL: the peer runs when the
        writer waits for puts. Handing it over cost the writer a switch interval (5 ms) per
        notice whenever a producer thread took the GIL meanwhile and kept it: put_async from
        one thread was capped near 24k msgs/s by two such waits per pass. False if the peer
        is down (being restarted)."""
        ref = self.ctx.peers.get(peer)
        if ref is not None and tell_keeping_gil(ref, message):
            return True
        return self.ctx.tell(peer, message)

    def _tell_flush_the_end(self) -> None:
        """On the ticker: the flush actor hears of bytes too few to have woken it, so its
        thorough flush (every flush_commitlog_thorough_interval_ms) covers everything."""
        end = self._readable_end()
        if end > self._flush_told:
            self._flush_told = end
            assert self._commitlog is not None
            self.ctx.tell(
                "flush",
                CommitLogAdvanced(
                    max_offset=end,
                    wrote_offset=self._commitlog.get_max_wrote_offset(),
                    store_timestamp=self._commitlog.store_timestamp,
                ),
            )

    def _tell_reput_the_end(self) -> None:
        commitlog = self._commitlog
        assert commitlog is not None
        advanced = CommitLogAdvanced(
            max_offset=self._readable_end(),
            wrote_offset=commitlog.get_max_wrote_offset(),
            store_timestamp=commitlog.store_timestamp,
        )
        self._reput_missed = not self.ctx.tell("reput", advanced)

    def _readable_end(self) -> int:
        """Where readers may read up to. With write buffers, not the last file's committed
        end: an earlier file's tail may still wait for its commit, and our readers are bounded
        by this one watermark, not by each file's own position (as Java's are)."""
        commitlog = self._commitlog
        assert commitlog is not None
        if self._pooled:
            return commitlog.committed_where
        return commitlog.get_max_offset()

    def _commit_pass(self) -> None:
        """With write buffers, a pass's bytes are copied into the files before its puts are
        answered: PUT_OK means in the page cache, as without them, so a killed process loses
        nothing acknowledged. RocketMQ answers while the bytes sit in the write buffer, and a
        kill -9 loses all since the last commit (commit_commitlog_least_pages and
        commit_interval_commitlog_ms decide when that is). The commit service's ticks then
        find little left; one copy per pass costs less than the pass's appends."""
        commitlog = self._commitlog
        assert commitlog is not None
        wrote = commitlog.get_max_wrote_offset()
        while commitlog.committed_where < wrote and not commitlog.commit(0):
            pass  # one file per call: a pass that rolled a segment commits both

    def _commit(self, least_pages: int) -> None:
        """The commit service's request (transient store pool): copy write buffers to files."""
        commitlog = self._commitlog
        assert commitlog is not None
        if not commitlog.commit(least_pages):  # False: progress was made
            self._publish_segments()
            advanced = CommitLogAdvanced(
                max_offset=self._readable_end(),
                wrote_offset=commitlog.get_max_wrote_offset(),
                store_timestamp=commitlog.store_timestamp,
            )
            self.ctx.read_view.publish_commitlog(advanced.max_offset)
            self.ctx.tell("flush", advanced)
            self.ctx.tell("reput", advanced)

    # cleaning (§12.4): the cleaner decided, the owner deletes ----------------------------------
    def _delete_expired(self, request: DeleteExpiredCommitLogFiles) -> CommitLogFilesDeleted:
        commitlog = self._commitlog
        assert commitlog is not None
        queue = commitlog.mapped_file_queue
        files = queue.mapped_files
        # Only segments whose records are all in the ConsumeQueues: one deleted before reput
        # reached it took acknowledged records no queue had counted, and the next start handed
        # their queue offsets out again, the queue's max offset fell (review 130 F1). Not bound
        # by the index, which is derived and may be left behind for good (an index that cannot
        # write: review 133 F1, no segment was deleted again, and the disk filled).
        dispatched = self.ctx.read_view.view.queues_written
        # Nor a segment found replaced, nor any after it: the file at its path is another
        # process's, not the store's to delete (review 151 F1: an older backup restored with its
        # times, or another store's segment, was deleted as expired; the copy is the owner's).
        replaced = self.ctx.read_view.view.replaced
        size = queue.mapped_file_size
        below = 0
        while (below < len(files) - 1 and files[below].file_from_offset + size <= dispatched
               and not in_ranges(replaced, files[below].file_from_offset)):  # fmt: skip
            below += 1
        window = min(max(request.max_files, 0), below) + 1
        if len(files) > window:
            # The storage loop keeps the last file of the list it is given: give it only the
            # oldest max_files + 1, so it deletes at most max_files. The cleaner sends the next
            # request after its pause, so the put path never sleeps between deletions.
            queue.mapped_files = files[:window]
            try:
                deleted = commitlog.delete_expired_file(
                    request.expired_ms, 0, request.forcibly_ms, request.clean_immediately, request.now_ms, _no_sleep
                )
            finally:
                queue.mapped_files = queue.mapped_files + files[window:]
        else:
            deleted = commitlog.delete_expired_file(
                request.expired_ms, 0, request.forcibly_ms, request.clean_immediately, request.now_ms, _no_sleep
            )
        return self._files_deleted(deleted)

    def _files_deleted(self, deleted: int) -> CommitLogFilesDeleted:
        assert self._commitlog is not None
        return CommitLogFilesDeleted(
            deleted=deleted,
            min_offset=self._commitlog.head_offset(),
            file_count=len(self._commitlog.mapped_file_queue.mapped_files),
        )

    # allocation --------------------------------------------------------------------------
    def _allocate(self, next_path: str, next_next_path: str | None, file_size: int) -> MappedFile | None:
        """Ask the allocate actor for the next segment; wait at most the configured timeout,
        then the queue creates the file itself (the allocator is slow or down)."""
        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        request = AllocateRequest(
            next_path=next_path, next_next_path=next_next_path, file_size=file_size,
            reply=Reply(future=future, store_internal_callback=True),
        )
        if not self.ctx.tell("allocator", request):
            return None
        try:
            mapped = future.get(timeout=self.config.allocate_wait_timeout_ms / 1000)
        except pykka.Timeout:
            self.log.warning("allocator too slow, creating the segment in the writer", path=next_path)
            return None
        except Exception as exc:  # the allocator crashed holding our request
            self.log.warning("allocator failed, creating the segment in the writer", path=next_path, error=repr(exc))
            return None
        if not isinstance(mapped, MappedFile):
            return None
        try:
            mapped.take_name()  # made ahead unnamed: the name is given by its owner, now
        except OSError as exc:
            # A file of that name exists (FileExistsError), or the link failed: the queue makes
            # or opens the segment itself, as when the allocator is slow.
            suppressed = self._naming_failures.admit(exc.errno)  # at the put rate while it lasts
            if suppressed is not None:
                self.log.warning("a segment made ahead could not be named, creating it in the writer",
                                 path=next_path, error=str(exc), **suppressed_fields(suppressed))  # fmt: skip
            mapped.destroy(0, self.ctx.clock_ms())  # unnamed: gives the map back, deletes nothing
            return None
        return mapped


def _no_sleep(_ms: int) -> None:
    raise AssertionError("the writer never sleeps between deletions (interval 0)")
