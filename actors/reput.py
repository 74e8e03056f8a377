"""ReputMessageService (spec §8): re-reads the CommitLog and fans records out.

It reads only below the watermark the writer told it (`CommitLogAdvanced.max_offset`), in
bounded batches, through its own read-only maps; each batch goes to the ConsumeQueue and
index actors as one `DispatchBatch`, then subscribers hear `MessageArrived`. Both receivers
are idempotent, so after any restart it may resume from the lower of their resume offsets.
Arrival notices go to a hook on the context (`on_arrivals`), owned by the store, so
subscriptions outlive a restart of this actor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import assert_never

from ..log import RepeatedLog
from ..messages import (
    AwaitDispatched,
    CommitLogAdvanced,
    ContinueDispatch,
    DispatchBatch,
    DispatchRequest,
    GetReputStatus,
    MessageArrived,
    Ping,
    Pong,
    ReputStatus,
    Tick,
)
from ..storage import codec, speedups
from ..storage.codec import RecordKind
from ..storage.commitlog import CommitLogReader, SegmentReplacedError, find_next_valid_record
from ..read_view import INDEX, QUEUES, ReadView
from .base import ActorContext, Periodic, ServiceUnavailable, StoreActor

__all__ = ["ReputMessageService", "newest_per_queue"]

DISPATCH_BATCH_MAX_RECORDS = 1024
# Batches handed on per message handled: a catch-up after a crash (gigabytes) goes in passes,
# and between them the actor answers its inbox (the start handshake, AwaitDispatched, status).
REPUT_PASS_MAX_BATCHES = 16
# Java's ReputMessageService sleeps 1 ms between passes; 0.5 ms gave put_batch 7% less (more
# dispatch passes, each waking two actors) and twice the spread between runs.
REPUT_LINGER_MS = 1
READ_CHUNK_BYTES = 4 * 1024 * 1024
READER_RELIST_INTERVAL_MS = 1_000
# Batches handed to the ConsumeQueue and index actors that they have not written yet (their
# published ends lag): past this many, reput waits for them, and if they make no progress
# within DISPATCH_BACKLOG_WAIT_S (a full disk holds their writes) it stops reading ahead, so
# the log never piles up in their memory. The commitlog is the source of truth: reput reads on
# from where it stopped once they catch up (checked on its ticks and the writer's notices).
# At most this many * DISPATCH_BATCH_MAX_RECORDS records wait in memory. The index alone
# behind (an index file that cannot be made) holds nothing else up: reput goes on for the
# ConsumeQueues and brings the index its records again from the log as it catches up.
DISPATCH_BACKLOG_MAX_BATCHES = 32
DISPATCH_BACKLOG_WAIT_S = 1.0


# What this actor takes; `handle` answers each with one reply type.
ReputRequest = CommitLogAdvanced | ContinueDispatch | Tick | AwaitDispatched | GetReputStatus | Ping


class ReputMessageService(StoreActor[ReputRequest]):
    name = "reput"

    def __init__(self, ctx: ActorContext, *, reput_offset: int, max_offset: int) -> None:
        super().__init__(ctx)
        self._reput_offset = reput_offset
        self._max_offset = max_offset
        self._segment_size = ctx.config.mapped_file_size_commitlog_bytes
        self._reader: CommitLogReader | None = None
        self._delay_levels = codec.parse_delay_levels(ctx.config.message_delay_level)
        self._awaiting: list[AwaitDispatched] = []
        self._in_flight: deque[int] = deque()  # end offsets of batches handed on, not yet written
        # The index's own cursor while it is behind the queues (None: it gets every batch the
        # queues get), and the end offsets of the batches handed to it alone, not yet written.
        self._index_offset: int | None = None
        self._index_in_flight: deque[int] = deque()
        self._held_back_since_ms = 0  # the backlog is full: reading ahead waits (0: it is not)
        self._continue_pending = False  # a ContinueDispatch is in the inbox
        self._relist = Periodic(ctx.ticker, READER_RELIST_INTERVAL_MS)  # its reader's listing of the segments (Tick)
        # (offset, size) of a whole record larger than READ_CHUNK_BYTES (put under a larger
        # max_message_size_bytes): the next read there takes all of it.
        self._large_record: tuple[int, int] | None = None
        # Dispatch waits at a commitlog hole (the offset), never going on past it: what lies in
        # the hole has queue offsets and keys nobody can read now, and records after it would
        # take filler units over those offsets and move the index past those keys for good.
        self._at_hole: int | None = None
        self._remap = False  # a segment's map faulted and was given back: relist at the next tick
        self._repeats = RepeatedLog(ctx.ticker.now_ms)  # waits retried at every tick, logged once a minute

    def on_start(self) -> None:
        self._reader = CommitLogReader(
            self.ctx.fs,
            self.config.commitlog_dir,
            mapped_file_size=self._segment_size,
            max_message_size=self.config.max_message_size_bytes,
            segments=self.ctx.read_view.current_segments,  # another file at a segment's path is not dispatched
        )
        # Not here, nor before the start handshake is answered (the Ping below starts it): a
        # re-dispatch may take longer than the supervisor waits for the handshake, and a crash
        # in a pass before the handshake would fail the open instead of being restarted.

    def _continue_later(self) -> None:
        if not self._continue_pending:
            self._continue_pending = True
            self.actor_ref.tell(ContinueDispatch())

    def release(self) -> None:
        self._repeats.flush(self.log)
        awaiting, self._awaiting = self._awaiting, []
        for request in awaiting:
            request.reply.fail(ServiceUnavailable("reput stopped before dispatch caught up"))
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def handle(self, message: ReputRequest) -> ReputStatus | Pong | None:
        match message:
            case CommitLogAdvanced():
                # Let a stream of puts gather first: one dispatch batch for many puts wakes the
                # ConsumeQueue and index actors once instead of per put (the GIL makes every
                # wake-up cost the producers too). Bounded, and far below any lag target.
                self.ctx.ticker.sleep_ms(REPUT_LINGER_MS)
                newest = self.newest_of_queued(message, key=_max_offset)
                if newest.max_offset > self._max_offset:
                    self._max_offset = newest.max_offset
                self._reput()
            case ContinueDispatch():
                self._continue_pending = False
                self._reput()
            case Tick():
                if self._reader is not None and (self._remap or self._relist.due()):
                    self._remap = False
                    # Segments the cleaner deleted are unmapped here too: a map of its own kept a
                    # deleted file's blocks, so a full disk got nothing back from the cleaner
                    # until a reopen (review 46 M5).
                    self._reader.refresh()
                self._reput()
            case AwaitDispatched(up_to=up_to):
                # `up_to` is readable (the writer said so): a notice still on its way adds nothing.
                if up_to > self._max_offset:
                    self._max_offset = up_to
                self._awaiting.append(message)
                self._reput()
            case GetReputStatus():
                return self._status()
            case Ping():
                self._continue_later()  # re-dispatch starts once the supervisor has us
                return Pong()
            case _:
                assert_never(message)
        self._answer_awaiting()
        return None

    def _answer_awaiting(self) -> None:
        if not self._awaiting:
            return
        status = self._status()
        waiting = []
        for request in self._awaiting:
            # Held back, dispatch cannot get further until the writers find room, nor at a
            # hole: the asker (shutdown) hears where it stands now rather than after its timeout.
            if self._reput_offset >= request.up_to or self._held_back_since_ms or status.at_hole:
                request.reply.send(status)
            else:
                waiting.append(request)
        self._awaiting = waiting

    def _status(self) -> ReputStatus:
        at_hole = self._at_hole is not None and self._at_hole == self._reput_offset
        return ReputStatus(reput_offset=self._reput_offset, max_offset=self._max_offset, at_hole=at_hole)

    def _reput(self) -> None:
        passes = 0
        while True:
            if passes == REPUT_PASS_MAX_BATCHES:
                self._continue_later()
                return
            if self.stop_requested():
                # A restart's stop waits behind this pass (and behind the messages before it,
                # each a pass): 16 batches, each up to DISPATCH_BACKLOG_WAIT_S behind slow
                # writers, outlasted the supervisor's wait, and the store gave up (review 115
                # F1). The successor reads on from the log.
                return
            if self._index_offset is not None and self._index_catches_up():
                passes += 1
                continue
            if self._reput_offset >= self._max_offset or self._backlog_full():
                return
            passes += 1
            read = self._read(self._reput_offset, self._max_offset)
            if read is None:
                return
            requests, next_offset = read
            if requests is not None:
                self._dispatch(requests, next_offset)
            self._reput_offset = next_offset

    def _read(self, offset: int, limit: int) -> tuple[list[DispatchRequest] | None, int] | None:
        """The dispatch requests of the log from `offset` (below `limit`) and where the next read
        starts; requests None where there is nothing to dispatch there (quarantined bytes, a
        cleaned file, a hole: skipped); None where the log is not readable yet."""
        reader = self._reader
        assert reader is not None
        while True:
            segment = offset - offset % self._segment_size
            if self._unread(offset):
                return None
            large = self._large_record
            chunk_bytes = large[1] if large is not None and large[0] == offset else READ_CHUNK_BYTES
            end = min(limit, segment + self._segment_size, offset + chunk_bytes)
            damaged = self._quarantined_from(offset)
            if damaged is not None:
                if damaged[0] <= offset and reader.has_segment(offset):
                    # Damage recovery quarantined: no unit and no index entry for it (the
                    # queue's next unit brings filler units for its queue offsets), whatever
                    # check_crc_on_read says: a reader must never get it. Skipped a segment
                    # at a time: a range recovery drew across a missing or cut segment (it
                    # sees the loaded files only) meets the hole below, and waits there
                    # instead of passing it (review 36 F2).
                    resume = min(damaged[1], limit, segment + self._segment_size)
                    self.log.error("skipping quarantined commitlog bytes", offset=offset, resume=resume)
                    # An empty batch: the queues and the index hear that their written end is
                    # past it, also when nothing follows (the open's and close's waits for them).
                    return [], resume
                if damaged[0] > offset:
                    end = min(end, damaged[0])  # decode up to it, then skip it
            # A view into the reader's own map, not a copy (the copy was a fifth of this
            # actor's time); released before anything here can unmap.
            # A short (truncated) segment ends at its valid records: a hole follows, not data.
            end = min(end, reader.readable_until(offset))
            chunk = reader.view(offset, end - offset, limit=limit) if end > offset else None
            if chunk is None:
                first = reader.min_offset()
                if first > offset:  # the cleaner removed it: continue at the first file left
                    return None, min(first, limit)
                unmapped = reader.map_error(offset)
                if isinstance(unmapped, SegmentReplacedError):
                    self._wait_at_replaced(offset, str(unmapped))
                    return None
                if unmapped is not None:
                    # There, but not mappable now (the process short of descriptors, memory or
                    # maps): no hole, nothing for `mqstore recover` (review 90 L3). Ticks retry.
                    self._repeats.say(self.log, "warning", "commitlog segment cannot be mapped now; dispatch waits",
                                      ("not mappable", getattr(unmapped, "errno", None)), offset=offset,
                                      error=str(unmapped))  # fmt: skip
                    return None
                later = reader.next_segment_after(offset)
                if later is not None and later <= limit and not reader.has_segment(offset):
                    # A missing or wrong-sized segment (a hole the store opened degraded with):
                    # dispatch waits here, quietly (ticks retry: a missing segment put back is
                    # read; one cut short and finished in place, at the next open).
                    if self._at_hole != offset:
                        self._at_hole = offset
                        self.log.error("dispatch waits at a commitlog hole until `mqstore recover` or the "
                                       "segments are back", offset=offset, data_resumes_at=later)  # fmt: skip
                    return None
                # Once, then once a minute with a count (review 90 L2: a line at every tick).
                self._repeats.say(self.log, "warning", "commitlog data not readable yet", "not readable yet",
                                  offset=offset, size=end - offset)  # fmt: skip
                return None
            try:
                requests, next_offset = self._decode(chunk, offset, segment, end)
            finally:
                chunk.release()
            if self._unread(offset):
                # A record that decoded with its tail in a page that faulted (its properties
                # the guard's zeros: a unit with tags code 0, keys lost; review 68 F2): nothing
                # of this read is dispatched. One compare while no map faulted.
                return None
            if next_offset == offset and not requests:
                if self._large_record is not None and self._large_record[0] == offset and chunk_bytes == READ_CHUNK_BYTES:
                    continue  # read it again, whole
                return None  # a partial record at the watermark's edge: wait for more
            return requests, next_offset

    def _wait_at_replaced(self, offset: int, why: str) -> None:
        """Dispatch waits, as at a hole, where the file this reader maps at a segment's path is
        not the one the writer maps (replaced under the store; the writer saves its copy): read
        as the log, the records it lacks took filler units and a consumer's get moved past them,
        and its own records took units of theirs (review 148 F1: 173 acknowledged messages
        passed over). A map made before the swap is the store's own file, and is read on.
        Nothing after it is dispatched; the copy, moved back, brings them all at the next open."""
        if self._at_hole != offset:
            self._at_hole = offset  # (the open and the close wait no longer for it)
            self.log.error("dispatch waits at a commitlog segment replaced under the store until it is closed and "
                           "the store's copy moved back", offset=offset, why=why)  # fmt: skip

    def _unread(self, offset: int) -> bool:
        """Whether the segment holding `offset` could not be read now (its map faulted: an I/O
        error, or the file cut meanwhile). Dispatch waits there as at a hole, and its ticks read
        again once the reader maps the segment anew (review 67 F2: the zeros were taken for
        damage, the segment's records skipped and filler units written for them, for good)."""
        reader = self._reader
        assert reader is not None
        unread = reader.unread(offset)
        if unread is None:
            return False
        self._remap = True  # the next tick maps the segment anew (its map was given back)
        if self._at_hole != offset:
            self._at_hole = offset  # (the open and the close wait no longer for it: as at a hole)
            self.log.error("dispatch waits: a commitlog page could not be read; nothing is skipped",
                           offset=offset, error=str(unread))  # fmt: skip
        return True

    def _larger_than_the_chunk(self, chunk: memoryview, offset: int, segment: int) -> bool:
        """Whether the record at the chunk's start says it is larger than the chunk and fits
        below the watermark in its segment (a record stored under a larger put limit); if so,
        noted so that the next read takes it whole."""
        if len(chunk) < 4:
            return False
        total = int.from_bytes(chunk[:4], "big", signed=True)
        whole = len(chunk) < total <= min(self._max_offset, segment + self._segment_size) - offset
        if whole and total <= self.config.max_stored_record_bytes and self._large_record != (offset, total):
            # (Read whole once already and still cut, by a hole or quarantined bytes: damage.)
            self._large_record = (offset, total)
            return True
        return False

    def _written(self, view: ReadView) -> int:
        """Below this commitlog offset the dispatchers reput hands every batch to wrote them."""
        if self.config.message_index_enable and self._index_offset is None:
            return min(view.queues_written, view.indexed_end)
        return view.queues_written

    def _backlog_full(self) -> bool:
        """Whether the dispatchers hold DISPATCH_BACKLOG_MAX_BATCHES batches not yet written and
        made no progress for DISPATCH_BACKLOG_WAIT_S (a full disk): then reput reads no further
        until they catch up. A backlog that is being written is waited for (its publications
        wake us): the readers' contract counts on reput handing on every record it may."""
        in_flight = self._in_flight
        written = self._written(self.ctx.read_view.view)
        while in_flight and in_flight[0] <= written:
            in_flight.popleft()
        if len(in_flight) >= DISPATCH_BACKLOG_MAX_BATCHES and not self._held_back_since_ms:
            oldest = in_flight[0]
            view = self.ctx.read_view.await_view(
                lambda v: self._written(v) >= oldest, DISPATCH_BACKLOG_WAIT_S, QUEUES | INDEX
            )
            if view is not None:
                written = self._written(view)
                while in_flight and in_flight[0] <= written:
                    in_flight.popleft()
        if len(in_flight) >= DISPATCH_BACKLOG_MAX_BATCHES and self._index_left_behind():
            in_flight = self._in_flight  # the queues' alone, below the bound
        if len(in_flight) >= DISPATCH_BACKLOG_MAX_BATCHES:
            if not self._held_back_since_ms:
                self._held_back_since_ms = self.ctx.clock_ms() or 1
                view = self.ctx.read_view.view
                self.log.error("dispatch backlog not written (a full disk, or a queue file that cannot be made or written): reput stops reading ahead until it is",
                               reput_offset=self._reput_offset, queues_written=view.queues_written,
                               indexed_end=view.indexed_end, batches=len(in_flight))  # fmt: skip
            return True
        if self._held_back_since_ms:
            self.log.info("dispatch backlog written: reput reads on", reput_offset=self._reput_offset,
                          waited_ms=self.ctx.clock_ms() - self._held_back_since_ms)  # fmt: skip
            self._held_back_since_ms = 0
        return False

    def _index_left_behind(self) -> bool:
        """With the backlog full and no progress in DISPATCH_BACKLOG_WAIT_S: if the queues have
        written theirs and only the index is stuck (an index file that cannot be made: EIO,
        EACCES, a full index directory), leave the index behind, as True. Before, reput
        stopped reading for the queues too: after 32 batches consumers saw nothing new while
        every put was acknowledged (review 24). The index keeps what it was handed, and
        `_index_catches_up` brings it the rest from the log once it writes again."""
        if self._index_offset is not None or not self.config.message_index_enable:
            return False
        view = self.ctx.read_view.view
        queues_behind = sum(1 for end in self._in_flight if end > view.queues_written)
        if queues_behind >= DISPATCH_BACKLOG_MAX_BATCHES:
            return False
        self._index_offset = self._reput_offset
        self._index_in_flight = deque(end for end in self._in_flight if end > view.indexed_end)
        self._in_flight = deque(end for end in self._in_flight if end > view.queues_written)
        self.log.error("the index is not writing what it was handed: dispatch goes on for the queues; the index "
                       "is brought the log from here once it writes again", index_from=self._reput_offset,
                       indexed_end=view.indexed_end, queues_written=view.queues_written)  # fmt: skip
        return True

    def _index_catches_up(self) -> bool:
        """One batch of the log, from the index's own cursor, for the index alone; False when
        there is none to hand on now (its backlog is full, or it is level with the queues:
        then it gets every batch again)."""
        assert self._index_offset is not None
        indexed_end = self.ctx.read_view.view.indexed_end
        in_flight = self._index_in_flight
        while in_flight and in_flight[0] <= indexed_end:
            in_flight.popleft()
        if len(in_flight) >= DISPATCH_BACKLOG_MAX_BATCHES:
            return False
        if self._index_offset >= self._reput_offset:
            if in_flight:
                return False  # level, but not yet written: wait (reput's ticks look again)
            self._index_offset = None
            self.log.info("the index caught up with the queues", offset=self._reput_offset)
            return False
        read = self._read(self._index_offset, self._reput_offset)
        if read is None:
            return False
        requests, next_offset = read
        next_offset = min(next_offset, self._reput_offset)
        if requests is not None:
            in_flight.append(next_offset)
            self.ctx.tell("index", DispatchBatch(requests=tuple(requests), end_offset=next_offset))
        self._index_offset = next_offset
        return True

    def _quarantined_from(self, offset: int) -> tuple[int, int] | None:
        """The first quarantined range that holds `offset` or lies after it."""
        for start, stop in self.ctx.read_view.view.quarantined:
            if stop > offset:
                return start, stop
        return None

    def _decode(self, chunk: memoryview, offset: int, segment: int, end: int) -> tuple[list[DispatchRequest], int]:
        """The dispatch requests in `chunk` (the log from `offset`) and where the next read starts."""
        requests: list[DispatchRequest] = []
        max_size = self.config.max_stored_record_bytes
        pos = 0
        limit = len(chunk)
        next_offset = offset
        fast = speedups.native
        while pos < limit and len(requests) < DISPATCH_BATCH_MAX_RECORDS:
            if fast is not None:
                # Plain records in C (shared ints, not tracked by the cycle collector: a
                # re-dispatch of millions of records set off collections that walked them);
                # it stops before anything else, which the Python decoder below classifies
                # (blank, end of data, damage, IPv6, delayed).
                decoded, fast_pos = fast.dispatch_scan(
                    chunk, pos, limit, DISPATCH_BATCH_MAX_RECORDS - len(requests), max_size,
                    codec.DispatchFields, codec.SCHEDULE_TOPIC_UTF8,
                )  # fmt: skip
                if decoded:
                    requests += decoded
                    pos = fast_pos
                    next_offset = offset + pos
                    continue
            kind, size, fields = codec.read_dispatch(
                chunk, pos, limit, self.config.max_stored_record_bytes, self._delay_levels
            )
            if kind is RecordKind.MESSAGE and fields is not None:
                requests.append(fields)
                pos += size
                next_offset = offset + pos
            elif kind is RecordKind.BLANK:
                next_offset = segment + self._segment_size  # rollNextFile
                break
            elif pos > 0 and end < min(self._max_offset, segment + self._segment_size):
                break  # a record cut by our chunk boundary: read again from its start
            elif pos == 0 and self._larger_than_the_chunk(chunk, offset, segment):
                break  # read again from its start, whole
            else:
                # Below the writer's watermark every record is whole, so this is damage that
                # recovery quarantined: skip to the next valid record (none: the rest of this
                # file's readable data, as a master does), never past valid ones.
                past = self._past_damage(offset + pos, segment)
                if self._unread(offset):  # (the chunk's segment: where dispatch stands and waits)
                    # The guard's zeros (a page that faulted, before or during the look past),
                    # not damage: nothing of this read is dispatched; it is read again from
                    # `offset` once the segment maps anew and reads.
                    return [], offset
                next_offset = past
                self.log.error("skipping damaged commitlog bytes below the watermark", offset=offset + pos,
                               kind=kind.value, resume=next_offset)  # fmt: skip
                break
        return requests, next_offset

    def _past_damage(self, damaged: int, segment: int) -> int:
        """The first trusted record after `damaged` in its segment, below the watermark."""
        readable_end = min(self._max_offset, segment + self._segment_size)
        reader = self._reader
        place = reader.select(segment, readable_end - segment) if reader is not None else None
        if place is None:
            return readable_end
        buf, base = place
        with memoryview(buf) as whole, whole[base : base + readable_end - segment] as view:
            found = find_next_valid_record(
                view, damaged - segment + 1, readable_end - segment, file_from_offset=segment,
                segment_size=self._segment_size, max_message_size=self.config.max_stored_record_bytes,
            )  # fmt: skip
        return segment + found if found is not None else readable_end

    def _dispatch(self, requests: list[DispatchRequest], end_offset: int) -> None:
        batch = DispatchBatch(requests=tuple(requests), end_offset=end_offset)
        self._in_flight.append(end_offset)
        # Published before the dispatchers hear of it, so a view whose queues cover an offset
        # always has the dispatched end past it too (a query waits for the index up to there).
        self.ctx.read_view.publish_dispatched(end_offset)
        self.ctx.tell("consume_queue", batch)
        self.ctx.faults.hit("reput.mid_dispatch")
        if self.config.message_index_enable and self._index_offset is None:
            self.ctx.tell("index", batch)
        if requests and self.config.long_polling_enable:
            self._notify(requests, end_offset)
        elif requests:
            self.ctx.on_arrivals([], end_offset)

    def _notify(self, requests: list[DispatchRequest], end_offset: int) -> None:
        native = speedups.native
        # In C the walk costs next to nothing; in Python it took close to half of this actor's time.
        newest = native.dispatch_arrivals(requests) if native is not None else newest_per_queue(requests)
        events = [
            MessageArrived(topic=topic, queue_id=queue_id, max_offset=max_offset, store_timestamp=ts)
            for topic, queue_id, max_offset, ts in newest
        ]
        self.ctx.on_arrivals(events, end_offset)


def newest_per_queue(requests: Sequence[DispatchRequest]) -> list[tuple[str, int, int, int]]:
    """(topic, queue id, offset after its newest record, that record's store timestamp) of
    each queue of a dispatch batch, in the order the queues first appear; PREPARED and
    ROLLBACK messages get no unit, so they do not count. `_native.dispatch_arrivals` in C."""
    newest: dict[tuple[str, int], tuple[int, int]] = {}
    for r in requests:
        if r.sys_flag & codec.TRANSACTION_MASK in (codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE):
            continue
        newest[(r.topic, r.queue_id)] = (r.consume_queue_offset + 1, r.store_timestamp)
    return [(topic, queue_id, max_offset, ts) for (topic, queue_id), (max_offset, ts) in newest.items()]


def _max_offset(advanced: CommitLogAdvanced) -> int:
    return advanced.max_offset
