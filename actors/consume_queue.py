"""The ConsumeQueue actor: owns every consumequeue/<topic>/<queueId>/ file (spec §9, §7.5).

Dispatch is idempotent (the duplicate guard of §9.3), so a batch replayed after a restart
writes nothing twice. Readers ask for units; they never touch the files.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from collections import OrderedDict, deque
from typing import Callable, Iterable, TypeVar, assert_never

from ..messages import (
    ClaimTopicDirectory,
    CleanUnusedTopics,
    ConsumeQueueFilesDeleted,
    ConsumeQueueFlushed,
    DeleteExpiredConsumeQueueFiles,
    DispatchBatch,
    FlushAll,
    GetOffsetByTime,
    GetQueueSnapshot,
    GetUnits,
    Ping,
    Pong,
    QueueBounds,
    QueueSnapshot,
    Tick,
    TopicDirectoryRefused,
    UnitsReply,
)
from ..log import RepeatedLog, suppressed_fields
from ..storage import codec, speedups
from ..storage.codec import is_topic_name, names_a_queue
from ..storage.commitlog import CommitLogReader
from ..storage.consume_queue import ConsumeQueue, TopicDirectoryTaken, list_consume_queues, make_topic_dir
from ..storage.fs import FileCutUnderMapError, UnreadPageError
from ..storage.mapped_file import DiskFullError, MappedFile
from ..storage.queue_ledger import LedgerEntry, write_queue_ledger
from ..storage.recovery import ConsumeQueueRecovery, LogFacts, RecoveryMode, lost_queue_offsets, recover_consume_queues
from .base import ActorContext, HeldWait, Periodic, StoreActor

__all__ = ["ConsumeQueueService", "pickup_store_timestamp"]

FLUSH_CALLS_PER_QUEUE_MAX = 8  # one call flushes one file: a bound per tick (a thorough flush: every file)

T = TypeVar("T")


# What this actor takes; `handle` answers each with one reply type.
ConsumeQueueRequest = (
    DispatchBatch
    | GetUnits
    | GetOffsetByTime
    | GetQueueSnapshot
    | Tick
    | FlushAll
    | DeleteExpiredConsumeQueueFiles
    | CleanUnusedTopics
    | ClaimTopicDirectory
    | Ping
)


def _why_not_written(cq: ConsumeQueue, topic: str, queue_id: int) -> str:
    why = cq.mapped_file_queue.last_create_error
    return f"cannot write consume queue {topic}/{queue_id}" + (f" ({why})" if why else "")


class QueueFileUnavailable(OSError):
    """A queue's next file could not be made or written (why is logged where it failed: a file
    where its directory belongs, permissions, a read-only remount). Dispatch waits and retries
    every tick, as for a full disk: failing the actor instead restarted it until the supervisor
    stopped the whole store, though the log was fine."""


class ConsumeQueueService(StoreActor[ConsumeQueueRequest]):
    name = "consume_queue"

    def __init__(self, ctx: ActorContext, *, mode: RecoveryMode, log_facts: LogFacts, index_dispatch_from: int | None) -> None:
        super().__init__(ctx)
        self._mode = mode
        self._log_facts = log_facts
        self._index_dispatch_from = index_dispatch_from
        self._recovered: ConsumeQueueRecovery | None = None
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._dispatched_offset = 0
        self._logics_msg_timestamp = 0
        self._thorough = Periodic(ctx.ticker, ctx.config.flush_consume_queue_thorough_interval_ms)
        # Batches not yet written because the disk had no blocks for their units: retried in
        # order on every tick and batch (a unit already written is skipped by the duplicate
        # guard), so dispatch waits for space instead of crashing and restarting.
        self._waiting: deque[DispatchBatch] = deque()
        self._held = HeldWait(self.log, "consume queue dispatch")
        # The queue ledger (storage.queue_ledger): what it last said, and the counts read at
        # open, which stand as a floor until re-dispatch has passed the log's end at open
        # (the queues it found missing or cut short are rebuilt by then).
        self._ledger_written: dict[tuple[str, int], LedgerEntry] | None = None
        self._cleaned_written: dict[tuple[str, int], int] | None = None
        self._ledger_floor: dict[tuple[str, int], LedgerEntry] = {}
        self._ledger_floor_until = 0
        self._ledger_stale = False
        self._ledger_failing = False
        # Queue offsets recovery found handed out before (its `reserved`; re-dispatch gives most
        # back, the rest were lost records'): each queue's next put continues after them, and
        # the ledger keeps them as the queue's high water until the queue's flushed units reach
        # them (filler units, `_fill_reserved`, hold the lost ones).
        self._reserved: dict[tuple[str, int], int] = {}
        self._refused_queues: set[tuple[str, int]] = set()  # logged once each
        # The process's map faults when this owner last found none of its maps faulted, and a
        # queue file a read found cut short (raised at the next tick: the restart rebuilds it).
        self._faults_seen = ctx.fs.map_faults()
        self._unreadable_file: FileCutUnderMapError | None = None
        # The queues whose files may be mapped, least recently written first: at most
        # consume_queue_mapped_queues_max (review 58 F2: every queue ever written kept its maps
        # and descriptors for the store's life, EMFILE at ~500 queues under `ulimit -n 1024`).
        # The others' files are flushed and unmapped, and mapped again at their next dispatch.
        self._mapped: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._mapped_max = max(1, ctx.config.consume_queue_mapped_queues_max)
        # Topics whose consumequeue/<topic>/ is known to be their own (make_topic_dir): a
        # queue of any other is opened only after that check.
        self._own_topic_dirs: set[str] = set()
        self._dir_refusals = RepeatedLog(ctx.ticker.now_ms)

    def on_start(self) -> None:
        root = self.config.consume_queue_dir
        # A restart: what the incarnation before published as written (every unit of a record
        # below it went into a map that did not fault). Its last batch may have lost units in
        # one queue while another queue's units went further; re-dispatch starts no later.
        written = self.ctx.read_view.view.queues_written if self._mode is RecoveryMode.RESTART else None
        moved = functools.partial(self.ctx.starting_moves, self.name)  # a queue at a time: the supervisor waits
        # This owner's part of recovery, the same on a first start and on every restart:
        # queue files of the wrong length set aside, units past the log's end (after a crash,
        # past the re-dispatch start) truncated, and where re-dispatch starts decided.
        recovered = self._recovered = recover_consume_queues(
            self.config, self.ctx.fs, mode=self._mode, log_facts=self._log_facts,
            index_dispatch_from=self._index_dispatch_from, clock_ms=self.ctx.clock_ms, written_before=written,
            progress=moved,
        )  # fmt: skip
        with contextlib.closing(self._commitlog()) as reader:
            min_phy_offset = reader.min_offset()
        self._reserved = dict(recovered.reserved)  # before the queues open: `_open` reads it
        for topic, queue_id in list_consume_queues(root, self.ctx.fs):
            moved()
            self._own_topic_dirs.add(topic)  # listed: spelled as on disk
            cq = self._open(topic, queue_id)
            cq.recover()
            if min_phy_offset >= 0:
                cq.correct_min_offset(min_phy_offset)  # recoverTopicQueueTable (§11.8)
            if cq.max_physic_offset >= 0:
                unit = cq.last_real_unit()  # not a filler: it points nowhere
                if unit is not None:
                    self._dispatched_offset = max(self._dispatched_offset, unit[0] + unit[1])
        # Below the re-dispatch start every queue holds its units (a queue rebuilt from the
        # log's start, or one that lost files, holds fewer than the others).
        self._dispatched_offset = min(self._dispatched_offset, recovered.dispatch_from)
        self._ledger_floor = dict(recovered.ledger)
        self._ledger_floor_until = self._log_facts.max_offset
        # Queues cleaned before (this run or, through the ledger, an earlier one): their older
        # records are not dispatched again, a crash's re-dispatch included (review 114 F1).
        # Never past the log's reach (review 117 F1: recovery lowers the ledger's; this run's
        # too), past its holes (118 F3).
        cleaned, end = self.ctx.cleaned_queues, self._log_facts.reach
        for key in cleaned.keys() | recovered.cleaned.keys():
            cleaned[key] = min(max(cleaned.get(key, 0), recovered.cleaned.get(key, 0)), end)
        self._ledger_stale = True  # written at the first tick: this open's queues, floors kept
        self._publish(self._queues, complete=True)

    def release(self) -> None:
        # Withdrawn first: a restarted actor may truncate what it recovers, and readers must
        # not trust these bounds until the successor publishes its own.
        self.ctx.read_view.publish_queues(None)
        for cq in self._queues.values():
            cq.mapped_file_queue.shutdown(0)
        self._queues.clear()
        self._mapped.clear()

    # mapped queues (review 58 F2) ------------------------------------------------------------
    def _in_use(self, key: tuple[str, int], cq: ConsumeQueue) -> None:
        """`cq` about to be written: its files mapped (again), and it the most recently used;
        the least recently used beyond consume_queue_mapped_queues_max give their maps back.
        OSError when the process has no descriptor, memory or map left for a file of it;
        FileCutUnderMapError for a file gone meanwhile (the actor fails, as for a file cut
        under its map, and the restart recovers the queue)."""
        mapped = self._mapped
        if key in mapped:
            mapped.move_to_end(key)
            return
        cq.map_files()
        mapped[key] = None
        self._unmap_idle()

    def _unmap_idle(self) -> None:
        """Flush and unmap the least recently used queues beyond the bound. One whose flush
        failed stays mapped (its pages must be written again from this map)."""
        mapped = self._mapped
        kept: list[tuple[str, int]] = []
        while len(mapped) > self._mapped_max:
            key, _ = mapped.popitem(last=False)
            cq = self._queues.get(key)
            if cq is not None and not cq.unmap_files():
                if cq.mapped_file_queue.last_io_error is not None:
                    self.ctx.derived_flush_failed = True  # as in _flush
                kept.append(key)
        for key in reversed(kept):
            mapped[key] = None
            mapped.move_to_end(key, last=False)

    def _while_mapped(self, key: tuple[str, int], cq: ConsumeQueue, read: Callable[[], T]) -> T:
        """`read()` of a queue's files: an idle queue's are mapped for it and given back after
        (reads do not make a queue recently used; readers' own maps serve most reads)."""
        if key in self._mapped:
            return read()
        try:
            return read()
        finally:
            cq.unmap_files()

    def _read_and_ask_faults(self, key: tuple[str, int], cq: ConsumeQueue, read: Callable[[], T]) -> tuple[T, MappedFile | None]:
        """`_while_mapped(read)` and the first of the queue's files whose map faulted, asked
        before an idle queue's maps are given back (review 69 F2: asked after, the fault was
        missed and the zeros served as no units). One C call while no map faulted."""

        def read_then_ask() -> tuple[T, MappedFile | None]:
            found = read()
            return found, cq.mapped_file_queue.faulted_file()

        return self._while_mapped(key, cq, read_then_ask)

    def _publish(self, keys: Iterable[tuple[str, int]], *, complete: bool = False) -> None:
        """Tell readers of consumequeue/ the bounds of `keys` (after the units are written)."""
        queues = self._queues
        bounds = {}
        for key in keys:
            cq = queues.get(key)
            if cq is not None:
                bounds[key] = (cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue())
        self.ctx.read_view.publish_queues(
            QueueBounds(bounds=bounds, dispatched_offset=self._dispatched_offset, complete=complete)
        )

    def _commitlog(self) -> CommitLogReader:
        """Read-only maps of the commitlog, for one lookup: closed right after, so this actor
        never keeps a segment the cleaner deleted (and its disk space) alive."""
        cfg = self.config
        return CommitLogReader(
            self.ctx.fs, cfg.commitlog_dir, mapped_file_size=cfg.mapped_file_size_commitlog_bytes,
            max_message_size=cfg.max_message_size_bytes, segments=self.ctx.read_view.current_segments,
        )  # fmt: skip

    def _new_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """A queue for a record of a queue not seen yet, or None when its topic or queue id
        cannot be one: a record whose header was damaged where the body CRC does not look
        (a flipped bit made "fz" into "f:"), or a crafted one. Its name would become a path
        under consumequeue/ ("../x" one outside it), so it gets no unit (verify reports the
        record); the queue it came from keeps its later units at their offsets."""
        if names_a_queue(topic, queue_id):
            refused = self._claim_topic_dir(topic)
            if refused is not None:
                # Never another topic's files (a store written before the check, or by a broker,
                # on a filesystem that does not tell case apart): dispatch waits, loudly.
                raise QueueFileUnavailable(f"cannot write consume queue {topic}/{queue_id}: {refused.detail}")
            return self._open(topic, queue_id)
        if (topic, queue_id) not in self._refused_queues:
            self._refused_queues.add((topic, queue_id))
            self.log.error("a record's topic or queue id cannot name a queue; it gets no unit", topic=repr(topic),
                           queue_id=queue_id)  # fmt: skip
        return None

    def _claim_topic_dir(self, topic: str) -> TopicDirectoryRefused | None:
        """consumequeue/<topic>/ made if missing and checked to be the topic's own, once per
        topic (None), or why not. Asked before a put of a topic new to the store is taken."""
        if topic in self._own_topic_dirs:
            return None
        if not is_topic_name(topic):
            return TopicDirectoryRefused(illegal=True, detail=f"{topic!r} cannot name a topic directory")
        try:
            make_topic_dir(self.ctx.fs, self.config.consume_queue_dir, topic)
        except TopicDirectoryTaken as exc:
            refused = TopicDirectoryRefused(illegal=True, detail=str(exc.strerror))
        except OSError as exc:
            # A name the filesystem cannot hold is the name's fault, for good; a directory it
            # cannot make now (permissions, a full disk, read-only) may be made later.
            illegal = exc.errno in (errno.EINVAL, errno.ENAMETOOLONG, errno.EILSEQ)
            what = "the filesystem refuses the topic's name" if illegal else "the topic's directory cannot be made"
            refused = TopicDirectoryRefused(illegal=illegal, detail=f"{what}: {exc}")
        else:
            self._own_topic_dirs.add(topic)
            return None
        # A host may put in a loop, and make a new topic per put (review 84 F6): a family.
        suppressed = self._dir_refusals.admit((topic, refused.illegal), family=refused.illegal)
        if suppressed is not None:
            self.log.error("a topic cannot have a directory of its own: its puts are refused, dispatch of its records "
                           "waits", topic=topic, detail=refused.detail, **suppressed_fields(suppressed))  # fmt: skip
        return refused

    def _open(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = ConsumeQueue(
            self.ctx.fs,
            topic,
            queue_id,
            self.config.consume_queue_dir,
            mapped_file_size=self.config.mapped_file_size_consume_queue_bytes,
            clock_ms=self.ctx.clock_ms,
        )
        if not cq.load():
            # Files that cannot be read now (out of descriptors, EIO) are not an empty queue:
            # taken for one, its next units went over those of acknowledged messages, which a
            # get then skipped for good (review 76 H1: a host holding most of its descriptors
            # while the store opened). The start fails, or dispatch waits for the next tick.
            queue = cq.mapped_file_queue
            queue.unmap_files()
            cause = queue.load_os_error
            raise QueueFileUnavailable(cause.errno if cause is not None and cause.errno else errno.EIO,
                                       f"cannot load consume queue {topic}/{queue_id}: {queue.load_error}",
                                       cause.filename if cause is not None else None)  # fmt: skip
        key = (topic, queue_id)
        cq.reserved_until = self._reserved.get(key, 0)
        self._queues[key] = cq
        self._mapped[key] = None
        self._unmap_idle()
        if self._ledger_written is not None and key not in self._ledger_written:
            self._ledger_stale = True  # a new queue: in the ledger before the next tick is over
        return cq

    def handle(
        self, message: ConsumeQueueRequest
    ) -> UnitsReply | int | QueueSnapshot | tuple[tuple[str, int], ...] | TopicDirectoryRefused | Pong | None:
        match message:
            case DispatchBatch():
                self._waiting.append(message)
                if not self._held:  # held: the ticks retry (HeldWait)
                    self._fail_if_a_file_was_unreadable()
                    self._give_back_faulted_maps()
                    self._dispatch_waiting()
            case GetUnits():
                return self._get_units(message)
            case GetOffsetByTime():
                return self._offset_by_time(message)
            case GetQueueSnapshot():
                return self._snapshot()
            case Ping():
                return Pong()
            case Tick():
                self._fail_if_a_file_was_unreadable()
                self._give_back_faulted_maps()
                self._dispatch_waiting()
                if (self._reserved and self._dispatched_offset >= self._ledger_floor_until and not self._waiting
                        and not self._log_facts.holes):  # fmt: skip
                    self._fill_reserved()
                self._flush(thorough=False)
                if self._ledger_stale:
                    self._write_ledger()
            case FlushAll(reply=reply):
                self._dispatch_waiting()  # once: close() is not held up by a full disk
                self._flush(thorough=True)
                reply.send(self._dispatched_offset)
            case DeleteExpiredConsumeQueueFiles(min_phy_offset=min_phy_offset, start_after=start_after, reply=reply):
                reply.send(self._delete_expired(min_phy_offset, start_after))
            case CleanUnusedTopics(keep=keep):
                return self._clean_unused_topics(keep)
            case ClaimTopicDirectory(topic=topic):
                return self._claim_topic_dir(topic)
            case _:
                assert_never(message)
        return None

    def _give_back_faulted_maps(self, *, fail: bool = True) -> None:
        """Maps of this owner that met a page they could not read (an I/O error, or the file
        cut) read the guard's zeros from that page on, and what is written into them reaches
        memory only (review 68 F1: a get skipped those units once the map went). Each is given
        back at once, its dirty units being the page cache's, and the next write or read maps
        the file again (review 69 F1: failing the actor instead stopped the whole store once
        an error lasted past the restart budget). One that cannot be given back fails the actor
        (FileCutUnderMapError: its restart reads the files and re-dispatches what they lack).
        Before any batch is written and on ticks; one compare while nothing faulted. A read
        (`fail` False) gives back what it can and leaves the rest to the next tick: its asker
        gets an answer, not the actor's failure."""
        faults = self.ctx.fs.map_faults()
        if faults == self._faults_seen:
            return
        for cq in self._queues.values():
            while (faulted := cq.mapped_file_queue.faulted_file()) is not None:
                if not faulted.give_back_faulted_map():
                    if not fail:
                        return
                    raise faulted.cut_error()
                self.log.error("a consume queue file could not be read; its map is made again", path=faulted.file_name,
                               errno=errno.EIO)  # fmt: skip
        self._faults_seen = faults

    def _fail_if_a_file_was_unreadable(self) -> None:
        """The FileCutUnderMapError a read met mapping a queue file again (cut short while
        idle: review 69 F5), raised here, at a batch or tick, not to the reader: the actor
        fails and its restart rebuilds the queue from the log."""
        if self._unreadable_file is not None:
            error, self._unreadable_file = self._unreadable_file, None
            raise error

    def _fail_if_written_into_a_faulted_map(self) -> None:
        """After a batch's writes, before it counts as written (published): a map that faulted
        while its units were written took them into the guard's memory, not the file (a file
        cut under it, or a full btrfs, where the file stays whole: review 70 H3).
        FileCutUnderMapError: the actor fails, and its restart re-dispatches from no later than
        what the last published batch wrote (`queues_written`). One compare while nothing faulted."""
        if self.ctx.fs.map_faults() == self._faults_seen:
            return
        for cq in self._queues.values():
            faulted = cq.mapped_file_queue.faulted_file()
            if faulted is not None:
                raise faulted.cut_error(writing=True)

    def _dispatch_waiting(self) -> None:
        """Write the waiting batches in order; stop at the first the disk has no room for, or
        whose queue file cannot be had. The first failure is logged (with the storage layer's
        own lines), a reminder every HELD_REMINDER_INTERVAL_MS; the retries in between quietly."""
        waiting = self._waiting
        while waiting:
            try:
                with self._held.quiet():
                    self._dispatch(waiting[0])
            except (DiskFullError, QueueFileUnavailable) as exc:
                why = "disk full" if isinstance(exc, DiskFullError) else "a consume queue file cannot be made or written"
                self._held.failed(self.ctx.clock_ms(), why, str(exc), waiting_batches=len(waiting))
                return
            waiting.popleft()
            self._held.ended(self.ctx.clock_ms())

    def _dispatch(self, batch: DispatchBatch) -> None:
        """Raises DiskFullError or QueueFileUnavailable with the batch to be written again
        (units already written are skipped then)."""
        # Consecutive records of one queue become one append, but writes stay in commitlog
        # order: after a crash, "everything below the newest unit's end is written" must hold,
        # because that is where dispatch resumes.
        native = speedups.native
        if native is not None:
            self._dispatch_runs(batch, native.cq_runs(batch.requests))
            return
        runs: list[tuple[tuple[str, int], list[tuple[int, int, int, int]]]] = []
        for req in batch.requests:
            tran = req.sys_flag & codec.TRANSACTION_MASK
            if tran == codec.TRANSACTION_PREPARED_TYPE or tran == codec.TRANSACTION_ROLLBACK_TYPE:
                continue
            key = (req.topic, req.queue_id)
            unit = (req.commitlog_offset, req.msg_size, req.tags_code, req.consume_queue_offset)
            if runs and runs[-1][0] == key:
                runs[-1][1].append(unit)
            else:
                runs.append((key, [unit]))
        hit = self.ctx.faults.hit
        cleaned = self.ctx.cleaned_queues
        for n, ((topic, queue_id), units) in enumerate(runs):
            if cleaned and (topic, queue_id) in cleaned:
                below = cleaned[(topic, queue_id)]
                units = [unit for unit in units if unit[0] >= below]
                if not units:
                    continue
            cq = self._queues.get((topic, queue_id)) or self._new_queue(topic, queue_id)
            if cq is None:
                continue
            self._map_for_dispatch(topic, queue_id, cq)
            if n == len(runs) // 2:
                hit("consume_queue.mid_write")
            if not cq.put_message_position_infos(units):
                raise QueueFileUnavailable(_why_not_written(cq, topic, queue_id))
        self._count_as_written(batch, {key for key, _ in runs})

    def _dispatch_runs(self, batch: DispatchBatch, runs: list[tuple[str, int, bytes, int, int, int, int]]) -> None:
        """`_dispatch` with the runs built in C: each run one queue, dense queue offsets,
        rising commitlog offsets, units packed."""
        hit = self.ctx.faults.hit
        middle = len(runs) // 2
        cleaned = self.ctx.cleaned_queues
        for n, (topic, queue_id, units, first_phy, last_phy, first_cq, count) in enumerate(runs):
            below = cleaned.get((topic, queue_id), 0) if cleaned else 0
            if first_phy < below:  # a removed queue's records (_dispatch)
                if last_phy < below:
                    continue
                kept = [unit for unit in codec.CQ_UNIT.iter_unpack(units) if unit[0] >= below]  # (a suffix: rising offsets)
                first_cq += count - len(kept)
                units, first_phy, count = b"".join(codec.CQ_UNIT.pack(*unit) for unit in kept), kept[0][0], len(kept)
            cq = self._queues.get((topic, queue_id)) or self._new_queue(topic, queue_id)
            if cq is None:
                continue
            self._map_for_dispatch(topic, queue_id, cq)
            if n == middle:
                hit("consume_queue.mid_write")
            if not cq.put_dense_run(units, first_phy, last_phy, first_cq, count):
                raise QueueFileUnavailable(_why_not_written(cq, topic, queue_id))
        # Each queue once: a batch of a few queues' interleaved puts holds many runs of each.
        self._count_as_written(batch, {(run[0], run[1]) for run in runs})

    def _count_as_written(self, batch: DispatchBatch, keys: set[tuple[str, int]]) -> None:
        """A batch's units are written: checked for a faulted map first (a restart
        re-dispatches from the last batch published), then published for `keys`."""
        self._fail_if_written_into_a_faulted_map()
        if batch.requests:
            self._logics_msg_timestamp = batch.requests[-1].store_timestamp
        self._dispatched_offset = max(self._dispatched_offset, batch.end_offset)
        self._publish(keys)

    def _map_for_dispatch(self, topic: str, queue_id: int, cq: ConsumeQueue) -> None:
        try:
            self._in_use((topic, queue_id), cq)
        except FileCutUnderMapError:
            raise
        except OSError as exc:
            raise QueueFileUnavailable(f"cannot map consume queue {topic}/{queue_id} again ({exc})") from exc

    def _get_units(self, request: GetUnits) -> UnitsReply:
        cq = self._queues.get((request.topic, request.queue_id))
        if cq is None:
            return UnitsReply(
                exists=False, min_offset=0, max_offset=0, units=None, next_file_offset=0,
                commitlog_head=self._dispatched_offset,
            )  # fmt: skip
        min_offset = cq.get_min_offset_in_queue()
        max_offset = cq.get_max_offset_in_queue()
        units = None
        unreadable = ""
        if min_offset <= request.offset < max_offset:
            faulted: MappedFile | None = None
            try:
                units, faulted = self._read_and_ask_faults((request.topic, request.queue_id), cq,
                                                           lambda: self._units_of(cq, request))  # fmt: skip
            except FileCutUnderMapError as exc:
                # An idle queue's file cut short: this get is answered "not now" (it raised to
                # the caller, every get: review 69 F5), and the next tick fails the actor,
                # whose restart rebuilds the queue from the log.
                self._unreadable_file = exc
                unreadable = f"{type(exc).__name__}: {exc}"
                self.log.error("a consume queue file could not be mapped again", path=exc.filename, error=str(exc))
            except OSError as exc:
                # Out of descriptors or maps: the units are there, only not readable now. Taken
                # for a file gone, the get moved a consumer past the whole file (review 60 H2).
                if exc.errno != errno.ENOENT:  # (gone: the cleaner's, OFFSET_FOUND_NULL as ever)
                    unreadable = f"{type(exc).__name__}: {exc}"
                self.log.warning("a consume queue file could not be mapped for a read", topic=request.topic,
                                 queue_id=request.queue_id, error=str(exc))  # fmt: skip
            if faulted is not None:
                # Units read from the guard's zeros (a page that could not be read) are none:
                # the get stops at them instead of moving a consumer past the file's units,
                # and the map is made again for the next read (_give_back_faulted_maps).
                units = None
                error = UnreadPageError(faulted.file_name, "read again once it reads")
                unreadable = f"{type(error).__name__}: {error}"
                self._give_back_faulted_maps(fail=False)
        return UnitsReply(
            unreadable=unreadable,
            exists=True,
            min_offset=min_offset,
            max_offset=max_offset,
            units=units,
            next_file_offset=cq.roll_next_file(request.offset),
            commitlog_head=self._dispatched_offset,
        )

    @staticmethod
    def _units_of(cq: ConsumeQueue, request: GetUnits) -> bytes | None:
        # getIndexBuffer (§9.4) bounded to what the reader scans: copying the rest of a
        # 6 MB file per ask cost more than the whole read.
        unit = codec.CQ_STORE_UNIT_SIZE
        offset = request.offset * unit
        mapped_file = cq.mapped_file_queue.find_mapped_file_by_offset(offset) if offset >= cq.min_logic_offset else None
        if mapped_file is None:
            return None
        pos = offset % cq.mapped_file_size
        size = min(mapped_file.read_position - pos, request.max_units * unit)
        return mapped_file.select(pos, size) if size > 0 else None

    def _offset_by_time(self, request: GetOffsetByTime) -> int:
        """getOffsetInQueueByTime (§9.5), reading store times through this actor's own maps."""
        cq = self._queues.get((request.topic, request.queue_id))
        if cq is None:
            return 0
        with contextlib.closing(self._commitlog()) as reader:
            pickup = functools.partial(pickup_store_timestamp, reader)
            key = (request.topic, request.queue_id)
            try:
                found, faulted = self._read_and_ask_faults(
                    key, cq, lambda: cq.get_offset_in_queue_by_time(request.timestamp_ms, pickup, reader.min_offset())
                )
            except FileCutUnderMapError as exc:
                self._unreadable_file = exc  # as for a get (_get_units)
                return -1
            except OSError as exc:  # out of descriptors or maps: the store's "failed"
                self.log.warning("a consume queue file could not be mapped for a read", topic=request.topic,
                                 queue_id=request.queue_id, error=str(exc))  # fmt: skip
                return -1
            # Units or store times read from the guard's zeros (a page that could not be read)
            # searched wrong: "cannot be known now", as for a file that cannot be mapped.
            if faulted is not None:
                self._give_back_faulted_maps(fail=False)
                return -1
            if self.ctx.fs.map_faults() != reader.faults_seen and reader.look_for_faults():
                return -1
            if reader.map_failures:  # a segment it had to map could not be, now: its times were not read
                return -1
            return found

    def _delete_expired(self, min_phy_offset: int, start_after: tuple[str, int] | None) -> ConsumeQueueFilesDeleted:
        """CleanConsumeQueueService (§12.6) for the queues after `start_after`, up to and
        including the first one that deleted files (the cleaner pauses, then resumes there)."""
        cleaned = self.ctx.cleaned_queues
        for key in [key for key, below in cleaned.items() if below <= min_phy_offset]:
            del cleaned[key]  # the removed queue's records are out of the log: nothing to keep out
            self._ledger_stale = True
        visited: list[tuple[str, int]] = []
        try:
            for key in sorted(self._queues):
                if start_after is not None and key <= start_after:
                    continue
                visited.append(key)
                cq = self._queues[key]
                try:
                    deleted = self._while_mapped(key, cq, functools.partial(cq.delete_expired_file, min_phy_offset))  # also corrects its min offset
                except FileCutUnderMapError:
                    raise
                except OSError as exc:
                    # Out of descriptors or maps for an idle queue: this pass leaves it, the
                    # next one cleans it; crashing the actor came back on every pass (review 60 M1).
                    self.log.warning("an idle consume queue could not be mapped for cleaning; next pass",
                                     topic=key[0], queue_id=key[1], error=str(exc))  # fmt: skip
                    continue
                if deleted > 0:
                    # At once: a first file that starts later than the ledger says is taken
                    # for one deleted by hand at the next open (and the queue rebuilt).
                    floor = self._ledger_floor.get(key)
                    if floor is not None:
                        self._ledger_floor[key] = floor._replace(first=self._first_offset(self._queues[key]))
                    self._write_ledger()
                    return ConsumeQueueFilesDeleted(deleted=deleted, last_queue=key)
            return ConsumeQueueFilesDeleted(deleted=0, last_queue=None)
        finally:
            self._publish(visited)  # their min offsets may have moved

    def _clean_unused_topics(self, keep: frozenset[str]) -> tuple[tuple[str, int], ...]:
        """cleanUnusedTopic (4.4.0 keeps the schedule topic whatever `keep` says)."""
        removed = tuple(sorted(key for key in self._queues if key[0] not in keep and key[0] != codec.SCHEDULE_TOPIC))
        if not removed:
            return removed
        # Out of the ledger first: once their files are gone the next open must not take
        # them for queues deleted by accident and rebuild them from the log.
        gone = set(removed)
        reserved = {key: self._reserved.pop(key) for key in removed if key in self._reserved}
        floors = {key: self._ledger_floor.pop(key) for key in removed if key in self._ledger_floor}
        survivors = {key: cq for key, cq in self._queues.items() if key not in gone}
        # Every record of them was dispatched (the store waits for that before it asks): those
        # below this end are theirs, in the ledger with them gone, for a crash's re-dispatch.
        cleaned = {**self.ctx.cleaned_queues, **{key: self._dispatched_offset for key in removed}}
        if not self._write_ledger(survivors, cleaned):
            self._reserved.update(reserved)
            self._ledger_floor.update(floors)
            self.log.error("cleanUnusedTopic: nothing deleted, the queue ledger could not be written", topics=sorted({t for t, _ in removed}))
            return ()
        # Withdrawn from readers first (a whole new table, a new map generation: readers drop
        # their maps of these files), then destroyed.
        doomed = [self._queues[key] for key in removed]
        self._queues = survivors
        for key in removed:
            self._mapped.pop(key, None)
        self._publish(survivors, complete=True)
        self.ctx.cleaned_queues.update(cleaned)
        for (topic, queue_id), cq in zip(removed, doomed):
            self._own_topic_dirs.discard(topic)  # checked again if it comes back
            cq.destroy()
            self.log.info("cleanUnusedTopic: ConsumeQueue cleaned", topic=topic, queue_id=queue_id)
        for topic in sorted({topic for topic, _ in removed}):
            self._remove_topic_dir(topic)
        return removed

    def _remove_topic_dir(self, topic: str) -> None:
        """consumequeue/<topic>/ once its queues' directories are gone (Java leaves it empty;
        an empty one would be listed as a topic by every tool)."""
        path = os.path.join(self.config.consume_queue_dir, topic)
        try:
            # rmdir, not a listing then a recursive removal: what appeared in between stays.
            if self.ctx.fs.isdir(path) and not self.ctx.fs.listdir(path):
                self.ctx.fs.rmdir(path)
        except OSError as exc:
            self.log.warning("removing a cleaned topic's directory failed", path=path, error=str(exc))

    def _snapshot(self) -> QueueSnapshot:
        return QueueSnapshot(
            topic_queue_table=self._next_queue_offsets(),
            resume_offset=self._dispatched_offset,
            logics_msg_timestamp=self._logics_msg_timestamp,
            waiting_batches=len(self._waiting),
            recovered=self._recovered,
            lost_queue_offsets=lost_queue_offsets(
                self._reserved, {f"{t}-{q}": cq.get_max_offset_in_queue() for (t, q), cq in self._queues.items()}
            ),
            cleaned=dict(self.ctx.cleaned_queues),
        )

    def _flush(self, *, thorough: bool) -> None:
        """FlushConsumeQueueService.doFlush (§7.5)."""
        least_pages = self.config.flush_consume_queue_least_pages
        logics_ts = durable_below = 0
        if thorough or self._thorough.due():
            least_pages = 0
            logics_ts = self._logics_msg_timestamp  # captured before flushing
            durable_below = self._dispatched_offset
        for cq in self._queues.values():
            # A thorough flush claims every unit below `durable_below` forced: each file of the
            # queue, not FLUSH_CALLS_PER_QUEUE_MAX of them (review 60 H1: a power loss then lost
            # the units past the eighth file that the checkpoint said were on disk).
            calls = len(cq.mapped_file_queue.mapped_files) + 1 if least_pages == 0 else FLUSH_CALLS_PER_QUEUE_MAX
            for _ in range(calls):
                done = cq.flush(least_pages)
                if cq.mapped_file_queue.last_io_error is not None:
                    # Linux reports a failed writeback once: a later flush "succeeds" without
                    # writing it, so none is believed in this run (ActorContext.derived_flush_failed).
                    self.ctx.derived_flush_failed = True
                if done:
                    break
        if least_pages == 0:
            self._write_ledger()
            self.ctx.tell("flush", ConsumeQueueFlushed(logics_msg_timestamp=logics_ts, thorough=True,
                                                       logics_flushed_offset=durable_below))  # fmt: skip

    def _fill_reserved(self) -> None:
        """Once re-dispatch has passed the log's end at open (every record still in the log has
        its unit back), the offsets still reserved are lost records': filler units hold them
        on disk, so the queue's units, and then the ledger's count, reach its high water even
        if no put ever comes (a queue whose directory is gone too: made again, else every open
        would rebuild it from the log's start). Not while the log has a hole the store is
        degraded on: its records may yet be restored, and units must then go back where they
        were (the ledger keeps the high water meanwhile). A full disk: tried again at the next
        tick."""
        filled = []
        for key, next_offset in list(self._reserved.items()):
            try:
                cq = self._queues.get(key) or self._new_queue(*key)
            except QueueFileUnavailable:  # its directory cannot be made now (review 72 M2): the next tick
                continue
            if cq is None:
                del self._reserved[key]  # a name that cannot be a queue: no put can reach it
                continue
            if cq.get_max_offset_in_queue() >= next_offset:
                continue
            try:
                self._in_use(key, cq)
                if not cq.fill_to(next_offset):
                    continue
            except FileCutUnderMapError:
                raise
            except (DiskFullError, OSError):
                continue
            filled.append(key)
            self.log.warning("queue offsets of lost records held by filler units; the queue continues after them",
                             topic=key[0], queue_id=key[1], next_offset=next_offset)  # fmt: skip
        if filled:
            self._publish(filled)
            self._ledger_stale = True

    def _next_queue_offsets(self) -> dict[str, int]:
        """The writer's topic-queue table: each queue's units, or its reserved offsets."""
        table = {f"{t}-{q}": cq.get_max_offset_in_queue() for (t, q), cq in self._queues.items()}
        for (topic, queue_id), next_offset in self._reserved.items():
            name = f"{topic}-{queue_id}"
            table[name] = max(table.get(name, 0), next_offset)
        return table

    def _write_ledger(
        self, queues: dict[tuple[str, int], ConsumeQueue] | None = None, cleaned: dict[tuple[str, int], int] | None = None
    ) -> bool:
        """Write the queue ledger: each queue's units on disk (its flushed ones) and its first
        file's start, no more optimistic than what was read at open while re-dispatch may still
        be rebuilding that queue, and the cleaned queues' floors (`cleaned`, else the context's).
        False if it could not be written (logged; tried again at the next tick)."""
        queues = self._queues if queues is None else queues
        cleaned = dict(self.ctx.cleaned_queues) if cleaned is None else cleaned
        if self._ledger_floor and self._dispatched_offset >= self._ledger_floor_until and not self._waiting:
            self._ledger_floor = {}
        unit = codec.CQ_STORE_UNIT_SIZE
        # A queue directory an older version (or a broker) made for a name that cannot be a
        # topic is left out: the ledger would not read back, and lose every other queue.
        entries = {
            key: LedgerEntry(cq.mapped_file_queue.flushed_where // unit, self._first_offset(cq))
            for key, cq in queues.items()
            if is_topic_name(key[0])
        }
        for key, (counted, first, high_water) in self._ledger_floor.items():
            entry = entries.get(key)
            entries[key] = LedgerEntry(counted, first, high_water) if entry is None else LedgerEntry(
                max(entry.units, counted), min(entry.first, first), max(entry.high_water, high_water)
            )
        for key, next_offset in list(self._reserved.items()):
            cq = queues.get(key)
            if cq is not None and cq.mapped_file_queue.flushed_where // unit >= next_offset:
                del self._reserved[key]  # the queue's own flushed units hold it now
                continue
            if not is_topic_name(key[0]):
                continue  # as above: such a queue is never in the ledger
            entry = entries.get(key) or LedgerEntry(0, 0)
            entries[key] = entry._replace(high_water=max(entry.high_water, next_offset))
        if entries == self._ledger_written and cleaned == self._cleaned_written:
            self._ledger_stale = False
            return True
        try:
            write_queue_ledger(self.ctx.fs, self.config.queue_ledger_path, entries, cleaned=cleaned)
        except OSError as exc:
            if not self._ledger_failing:  # once, not at every tick of a full disk
                self.log.error("queue ledger not written; retried at every tick", error=str(exc))
            self._ledger_failing = True
            self._ledger_stale = True
            return False
        if self._ledger_failing:
            self.log.info("queue ledger written again")
            self._ledger_failing = False
        self._ledger_written = entries
        self._cleaned_written = cleaned
        self._ledger_stale = False
        return True

    @staticmethod
    def _first_offset(cq: ConsumeQueue) -> int:
        """The queue offset the queue's first file starts at (0 without files)."""
        files = cq.mapped_file_queue.mapped_files
        return files[0].file_from_offset // codec.CQ_STORE_UNIT_SIZE if files else 0


def pickup_store_timestamp(reader: CommitLogReader, offset: int, size: int) -> int:
    """STORETIMESTAMP of the record at `offset` if all `size` bytes from there are readable
    (in one existing segment), else -1 (§9.5). Reads the head only, not the whole record."""
    head = codec.store_timestamp_position(codec.BORNHOST_V6_FLAG) + 8
    if offset < 0 or size < head or offset % reader.mapped_file_size + size > reader.mapped_file_size:
        return -1
    data = reader.read(offset, head, limit=offset + size)
    if data is None:
        return -1
    sys_flag = int.from_bytes(data[codec.SYSFLAG_POSITION : codec.SYSFLAG_POSITION + 4], "big")
    position = codec.store_timestamp_position(sys_flag)
    return int.from_bytes(data[position : position + 8], "big", signed=True)
