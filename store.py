"""The embedded API: `mqstore.open(path)` gives a `MessageStore`, safe to use from many threads.

Puts are encoded in the caller's thread and told to the writer with a future; gets ask the
ConsumeQueue actor for positions, queries find keys in the index files the index actor
publishes, and both read through the calling thread's own read-only maps.
`MessageStore.actor_ref` is the same store for pykka actors: send it
`mqstore.messages.Put/Get/Query/Subscribe` with a `Reply`.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Sequence

import psutil
import pykka

from .actors.base import ServiceUnavailable
from .actors.consume_queue import pickup_store_timestamp
from .config import StoreConfig
from .faults import NO_FAULTS, FaultPlan
from .log import get_logger
from .messages import (
    Asked,
    EncodedPut,
    FlushAll,
    Get,
    GetOffsetByTime,
    GetResult,
    GetUnits,
    Message,
    MessageArrived,
    Ping,
    Put,
    PutResult,
    Query,
    QueryOffsets,
    QueryOffsetsReply,
    QueryResult,
    QueueBounds,
    Reply,
    Subscribe,
    UnitsReply,
    Unsubscribe,
    Waiter,
)
from .storage import codec
from .storage.codec import MessageRecord
from .storage.commitlog import CommitLogReader
from .storage.consume_queue import ConsumeQueueReader
from .storage.consumer_offsets import ConsumerOffsetStore
from .storage.disk import DiskGauge
from .storage.index import IndexReader
from .storage.fs import FileSystem
from .storage import speedups
from .storage.status import GetMessageStatus, PutMessageStatus
from .stats import StatsTicker, StoreStats, records_get, store_snapshot
from .supervisor import Supervisor, SupervisorState

__all__ = ["MessageStore", "open_store"]

_DEFAULT_BORN_HOST = codec.HostAddress("127.0.0.1", 0)
_DEFAULT_BORN_IP4 = _DEFAULT_BORN_HOST.address_bytes()
_TOTAL_RAM_BYTES = psutil.virtual_memory().total or 24 * 1024**3
_REPLY_MARGIN_S = 10.0
# A reader thread re-lists the commitlog at least this often, so a segment the cleaner deleted
# reads as deleted (MESSAGE_WAS_REMOVING) and its disk space is not kept alive by our maps.
READER_REFRESH_INTERVAL_MS = 1_000
# How long after a put started reads still count puts as flowing (see _puts_flowing).
PUTS_FLOWING_NS = 50_000_000
# The broker's flushConsumerOffsetInterval: committed offsets reach the disk this often.
CONSUMER_OFFSET_PERSIST_INTERVAL_MS = 5_000
_open_stores: "weakref.WeakSet[MessageStore]" = weakref.WeakSet()


def open_store(
    path: str | os.PathLike[str] | None = None,
    *,
    config: StoreConfig | None = None,
    fs: FileSystem | None = None,
    clock_ms: Callable[[], int] | None = None,
    faults: FaultPlan = NO_FAULTS,
    on_fatal: Callable[[BaseException], None] | None = None,
    disk_gauge: DiskGauge | None = None,
    cleaner_sleep_ms: Callable[[int], None] | None = None,
    **settings: Any,
) -> MessageStore:
    """Open (or create) the store at `path` and start its actors. `settings` are StoreConfig
    keys (`flush_disk_type="SYNC_FLUSH"`, ...) applied over `config` (or the defaults, a
    config file and MQSTORE_* variables). `disk_gauge` is what the cleaner reads the disk
    level from (default: psutil over the store paths) and `cleaner_sleep_ms` its pause between
    two deletions (default: a real sleep); tests pass a FixedDiskGauge and a recording sleep."""
    overrides = dict(settings)
    if path is not None:
        overrides["store_path_root_dir"] = os.fspath(path)
    if config is None:
        config = StoreConfig.load(overrides=overrides)
    elif overrides:
        config = config.replace(**overrides)
    store = MessageStore(
        config,
        fs=fs,
        clock_ms=clock_ms,
        faults=faults,
        on_fatal=on_fatal,
        disk_gauge=disk_gauge,
        cleaner_sleep_ms=cleaner_sleep_ms,
    )
    store._start()
    return store


class MessageStore:
    def __init__(
        self,
        config: StoreConfig,
        *,
        fs: FileSystem | None = None,
        clock_ms: Callable[[], int] | None = None,
        faults: FaultPlan = NO_FAULTS,
        on_fatal: Callable[[BaseException], None] | None = None,
        disk_gauge: DiskGauge | None = None,
        cleaner_sleep_ms: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        self.supervisor = Supervisor(
            config,
            fs=fs,
            clock_ms=clock_ms,
            faults=faults,
            on_fatal=on_fatal,
            disk_gauge=disk_gauge,
            cleaner_sleep_ms=cleaner_sleep_ms,
        )
        self.fs = self.supervisor.fs
        self.clock_ms = self.supervisor.clock_ms
        self.store_host = self.supervisor.store_host
        self._store_host_ip4 = None if self.store_host.is_ipv6 else self.store_host.address_bytes()
        self._local = threading.local()
        # Each reading thread's own readers of the commitlog, consumequeue/ and index/
        # (thread-local); held weakly, so a thread that ends takes its maps with it (a host
        # that starts a thread per request would otherwise pile up maps until close()), and
        # close() closes those of the living threads.
        self._readers: weakref.WeakSet[CommitLogReader | ConsumeQueueReader | IndexReader] = weakref.WeakSet()
        self._readers_lock = threading.Lock()
        self._arrived: dict[tuple[str, int], int] = {}
        self._dispatched_end = 0  # commitlog offset the reput actor has dispatched up to
        self._arrival_cond = threading.Condition()
        self._subscribers: list[tuple[Any, str | None, int | None]] = []
        self._subscribers_lock = threading.Lock()
        self._reply_timeout_s = (config.sync_flush_timeout_ms + config.allocate_wait_timeout_ms) / 1000 + _REPLY_MARGIN_S
        self._gateway: pykka.ActorRef[Any] | None = None
        self._closed = False
        self.log = get_logger("mqstore.store", store=config.store_path_root_dir)
        self.supervisor.ctx.on_arrivals = self._on_arrivals
        # The index actor's last published (file names oldest first, indexed end offset); None
        # until it published once, and then queries ask the actor. One attribute, so a reader
        # never pairs the names of one publication with the offset of another.
        self._index_progress: tuple[tuple[str, ...], int] | None = None
        self._index_cond = threading.Condition()
        self.supervisor.ctx.on_index_progress = self._on_index_progress
        # What the ConsumeQueue actor published (QueueBounds): `get` reads units through each
        # thread's own maps below these bounds instead of asking the actor.
        self._queue_bounds: dict[tuple[str, int], tuple[int, int]] = {}
        self._queue_bounds_live = False
        self._queue_units_written = 0  # commitlog offset below which every dispatched unit is written
        self._queue_maps_generation = 0  # bumped when files may be gone: readers drop their maps
        self._last_put_ns = 0  # when the newest put started: readers give way while puts flow
        self.supervisor.ctx.on_queue_bounds = self._on_queue_bounds
        self.stats_service = StoreStats(self.clock_ms)  # StoreStatsService (§16)
        # Sampled every second by the supervisor's ticker; <root>/stats.msgpack every interval.
        self._stats_ticker = StatsTicker(self)
        self.supervisor.ctx.on_tick_ms.append(self._stats_ticker)
        # Consumer offsets (the broker's ConsumerOffsetManager): committed in memory, persisted
        # by a timer thread (started by the first commit) and at close.
        self._offsets = ConsumerOffsetStore(self.fs, config.store_path_root_dir)
        self._offsets_lock = threading.Lock()
        self._offsets_dirty = False
        self._offsets_stop = threading.Event()
        self._offsets_thread: threading.Thread | None = None

    # lifecycle ---------------------------------------------------------------------------
    def _start(self) -> None:
        self.supervisor.start()
        self._gateway = StoreGateway.start(self)
        _open_stores.add(self)
        try:
            self._offsets.load()  # neither file nor .bak parses: fail the open, like the broker
        except Exception:
            self.close()
            raise

    def close(self) -> bool:
        """Stop cleanly (dispatch caught up, everything flushed, abort file removed).
        Returns True if the stop was clean. Idempotent."""
        if self._closed:
            return self.supervisor.clean_stop
        self._closed = True
        if self.supervisor.state is SupervisorState.RUNNING:
            self._stats_ticker.close()  # the last snapshot of this run, while the lag is known
        self._stop_offsets_timer()
        if self._gateway is not None:
            try:
                self._gateway.stop(block=True, timeout=5)
            except (pykka.ActorDeadError, pykka.Timeout):
                pass
        clean = self.supervisor.stop()
        with self._readers_lock:
            for reader in list(self._readers):
                reader.close()
            self._readers.clear()
        with self._arrival_cond:
            self._arrival_cond.notify_all()
        with self._index_cond:
            self._index_cond.notify_all()
        _open_stores.discard(self)
        return clean

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self.supervisor.state is SupervisorState.RUNNING and not self._closed

    @property
    def actor_ref(self) -> pykka.ActorRef[Any]:
        """The store as a pykka actor: tell it Put/Get/Query/Subscribe/Unsubscribe."""
        assert self._gateway is not None, "store not started"
        return self._gateway

    # put ---------------------------------------------------------------------------------
    def put(self, message: Message) -> PutResult:
        return self._put_and_wait((message,), batch=False)

    def put_batch(self, messages: Sequence[Message]) -> PutResult:
        """Put messages of one topic and queue as one contiguous batch (RocketMQ's putMessages):
        consecutive queue offsets, never split across segments, one result."""
        return self._put_and_wait(tuple(messages), batch=True)

    def _put_and_wait(self, messages: Sequence[Message], *, batch: bool) -> PutResult:
        started_ns = self._last_put_ns = time.monotonic_ns()
        checked = self._precheck(messages, batch)
        if isinstance(checked, PutResult):
            return checked  # refused before the writer: not a put in the stats
        waiter = Waiter()
        down = self._tell_writer(messages, batch, checked, Reply(future=waiter))
        result = down if down is not None else self._wait(waiter)
        self.stats_service.record_put(messages[0].topic, result, time.monotonic_ns() - started_ns)
        return result

    def submit_put(self, messages: Sequence[Message], *, batch: bool, reply: Reply | None = None) -> Waiter | PutResult:
        """Encode here, tell the writer, return at once: a waiter for the answer (or the early
        result when the put was refused before reaching the writer). With `reply`, the answer
        goes there (and stats are recorded when it arrives)."""
        started_ns = self._last_put_ns = time.monotonic_ns()
        waiter: Waiter | None = None
        if reply is None:
            waiter = Waiter()
            reply = Reply(future=waiter)
        checked = self._precheck(messages, batch)
        if isinstance(checked, PutResult):
            reply.send(checked)
            return checked
        down = self._tell_writer(messages, batch, checked, self.stats_service.timed_reply(messages[0].topic, reply, started_ns))
        if down is not None:
            return down
        return waiter if waiter is not None else PutResult(status=PutMessageStatus.PUT_OK, detail="submitted")

    def _tell_writer(
        self, messages: Sequence[Message], batch: bool, checked: tuple[tuple[bytes, ...], int, bool], reply: Reply
    ) -> PutResult | None:
        """Hand the encoded put to the writer, which answers `reply`; if the writer is down
        (being restarted), answer `reply` with SERVICE_NOT_AVAILABLE here and return that."""
        records, sys_flag, sync_wait = checked
        first = messages[0]
        put = EncodedPut(
            records=records,
            topic=first.topic,
            queue_id=first.queue_id,
            sys_flag=sys_flag,
            batch=batch,
            sync_wait=sync_wait,
            reply=reply,
            enqueued_ns=time.monotonic_ns(),
        )
        if not self.supervisor.ctx.tell("writer", put):
            result = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail="writer is restarting")
            reply.send(result)
            return result
        return None

    def _wait(self, submitted: Waiter | PutResult) -> PutResult:
        if isinstance(submitted, PutResult):
            return submitted
        try:
            result: PutResult = submitted.get(timeout=self._reply_timeout_s)
            if result.stored:
                self._local.last_put_end = result.commitlog_offset + result.wrote_bytes
            return result
        except pykka.Timeout:
            return PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail="no answer from the writer in time")
        except ServiceUnavailable as exc:
            return PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=str(exc))

    def _precheck(self, messages: Sequence[Message], batch: bool) -> PutResult | tuple[tuple[bytes, ...], int, bool]:
        """DefaultMessageStore.putMessage(s) pre-checks (§6.1), then encoding (§6.2)."""
        if not self.running:
            return PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail="store is not running")
        if not messages:
            raise ValueError("no messages to put")
        first = messages[0]
        try:
            codec.validate_topic(first.topic)
        except codec.TopicError as exc:
            return PutResult(status=PutMessageStatus.MESSAGE_ILLEGAL, detail=str(exc))
        now = self.clock_ms()
        max_size = self.config.max_message_size_bytes
        fast = speedups.native
        if fast is not None and self._store_host_ip4 is not None and type(first.queue_id) is int and 0 <= first.queue_id <= 0x7FFFFFFF:
            # The C encoder takes plain messages of the first one's topic and queue whole or
            # none; anything it declines (custom properties, a born host, a mixed batch, an
            # error to report) goes through the checks and the loop below.
            encoded = fast.encode_batch(
                messages, first.topic.encode("utf-8"), now, _DEFAULT_BORN_IP4, _DEFAULT_BORN_HOST.port,
                self._store_host_ip4, self.store_host.port, max_size, first.topic, first.queue_id,
            )  # fmt: skip
            if encoded is not None:
                total = sum(map(len, encoded))
                if batch and total > max_size:
                    return PutResult(status=PutMessageStatus.MESSAGE_ILLEGAL, detail=f"batch of {total} bytes > {max_size}")
                return encoded, 0, True
        if batch and any(m.topic != first.topic or m.queue_id != first.queue_id for m in messages):
            return PutResult(status=PutMessageStatus.MESSAGE_ILLEGAL, detail="a batch must have one topic and queue")
        records = []
        total = 0
        for message in messages:
            if not isinstance(message.body, (bytes, bytearray, memoryview)):
                raise TypeError(f"message body must be bytes, not {type(message.body).__name__}")
            if not isinstance(message.queue_id, int) or message.queue_id < 0:
                raise ValueError(f"queue_id must be a non-negative int, not {message.queue_id!r}")
            try:
                props = self._properties(message)
            except ValueError as exc:
                return PutResult(status=PutMessageStatus.MESSAGE_ILLEGAL, detail=str(exc))
            if len(props) > codec.MAX_PROPERTIES_BYTES:  # Java's pre-check counts UTF-16 chars
                return PutResult(status=PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, detail=f"{len(props)} chars")
            born = codec.HostAddress.parse(message.born_host) if message.born_host else _DEFAULT_BORN_HOST
            try:
                data = codec.encode_message(
                    topic=message.topic,
                    queue_id=message.queue_id,
                    body=bytes(message.body),
                    properties=props,
                    flag=message.flag,
                    born_timestamp=message.born_timestamp_ms if message.born_timestamp_ms is not None else now,
                    born_host=born,
                    store_host=self.store_host,
                    max_message_size=max_size,
                )
            except (codec.MessageTooLarge, codec.PropertiesTooLarge) as exc:
                return PutResult(status=PutMessageStatus.MESSAGE_ILLEGAL, detail=str(exc))
            total += len(data)
            records.append(data)
        if batch and total > max_size:
            return PutResult(status=PutMessageStatus.MESSAGE_ILLEGAL, detail=f"batch of {total} bytes > {max_size}")
        sync_wait = all(m.wait_store_msg_ok for m in messages)
        return tuple(records), 0, sync_wait

    @staticmethod
    def _properties(message: Message) -> str:
        keys = message.keys
        if keys:
            joined = keys if isinstance(keys, str) else codec.KEY_SEPARATOR.join(keys)
            count = 1 if isinstance(keys, str) else len(keys)
            # KEYS are space-separated on disk: a key with a space (or an empty one) would
            # come back as different keys.
            if joined.count(codec.KEY_SEPARATOR) != count - 1 or (count > 1 and "" in keys) or not joined:
                raise ValueError(f"keys {keys!r}: each key must be non-empty and without spaces")
        else:
            joined = ""
        if not message.properties and message.wait_store_msg_ok:
            # The common case, in the order a Java producer's HashMap gives (KEYS before TAGS).
            tags = message.tags
            if joined and tags:
                text = f"KEYS\x01{joined}\x02TAGS\x01{tags}\x02"
            elif joined:
                text = f"KEYS\x01{joined}\x02"
            elif tags:
                text = f"TAGS\x01{tags}\x02"
            else:
                return ""
            if text.count("\x01") != text.count("\x02") or text.count("\x01") != 1 + (bool(joined) and bool(tags)):
                raise ValueError("tags or keys contain a reserved separator character (\\x01 or \\x02)")
            return text
        props = dict(message.properties)
        if message.tags:
            props[codec.PROPERTY_TAGS] = message.tags
        if joined:
            props[codec.PROPERTY_KEYS] = joined
        if not message.wait_store_msg_ok:
            props[codec.PROPERTY_WAIT_STORE_MSG_OK] = "false"
        return codec.properties_to_string(props) if props else ""

    # reads -------------------------------------------------------------------------------
    def _reader(self) -> CommitLogReader:
        reader = getattr(self._local, "reader", None)
        if reader is not None:
            now_ms = time.monotonic_ns() // 1_000_000
            if now_ms - self._local.refreshed_ms >= READER_REFRESH_INTERVAL_MS:
                reader.refresh()
                self._local.refreshed_ms = now_ms
        else:
            self._local.refreshed_ms = time.monotonic_ns() // 1_000_000
            reader = CommitLogReader(
                self.fs,
                self.config.commitlog_dir,
                mapped_file_size=self.config.mapped_file_size_commitlog_bytes,
                max_message_size=self.config.max_message_size_bytes,
            )
            self._local.reader = reader
            with self._readers_lock:
                self._readers.add(reader)
        return reader

    def _ask(self, peer: str, message: Any) -> Any:
        ref = self.supervisor.ctx.peers.get(peer)
        if ref is None or not self.running:
            raise ServiceUnavailable(f"{peer} is not running")
        waiter = Waiter()
        try:
            ref.tell(Asked(message, Reply(future=waiter)))
            return waiter.get(timeout=self._reply_timeout_s)
        except (pykka.ActorDeadError, pykka.Timeout) as exc:
            raise ServiceUnavailable(f"{peer} did not answer: {exc}") from exc

    def _units(self, topic: str, queue_id: int, offset: int, max_units: int) -> UnitsReply:
        return self._ask("consume_queue", GetUnits(topic=topic, queue_id=queue_id, offset=offset, max_units=max_units))

    def _puts_flowing(self) -> bool:
        """Whether a put started within PUTS_FLOWING_NS. Gets and queries through the caller's
        own maps never block, so a thread reading in a loop holds the GIL for CPython's whole
        switch interval (5 ms) at a time, and every put hand-off (caller -> writer -> caller)
        waits that long: a consumer catching up cut a producer from 90k to 8k msgs/s. While
        puts flow, reads ask the owning actor instead, blocking as they always did (same run:
        consumer 61-77k, producer 87-95k msgs/s)."""
        return time.monotonic_ns() - self._last_put_ns < PUTS_FLOWING_NS

    def _published_bounds(self, topic: str, queue_id: int, *, all_dispatched: bool = False) -> tuple[int, int] | None:
        """The queue's (min, max) offsets as the ConsumeQueue actor last published them, if
        they cover the calling thread's own last put (read-your-writes); else None: ask.
        `all_dispatched`: only if they also cover everything dispatch has reported (arrivals,
        long polling), as an ask queued behind those dispatch batches would."""
        bounds = self._queue_bounds.get((topic, queue_id))
        if bounds is None or not self._queue_bounds_live:
            return None
        written = self._queue_units_written
        if getattr(self._local, "last_put_end", 0) > written or (all_dispatched and self._dispatched_end > written):
            return None
        return bounds

    def _units_direct(self, topic: str, queue_id: int, offset: int, max_units: int) -> UnitsReply | None:
        """`_units` through this thread's own maps, for an offset inside the published bounds
        (every other status is decided by the actor); None when that does not hold."""
        written = self._queue_units_written
        bounds = self._published_bounds(topic, queue_id)
        if bounds is None:
            return None
        min_offset, max_offset = bounds
        if not min_offset <= offset < max_offset:
            return None
        reader = self._queue_reader()
        units = reader.read_units(topic, queue_id, offset, min(max_units, max_offset - offset))
        if units is None:
            return None
        units_per_file = reader.mapped_file_size // codec.CQ_STORE_UNIT_SIZE
        return UnitsReply(
            exists=True,
            min_offset=min_offset,
            max_offset=max_offset,
            units=units,
            next_file_offset=offset + units_per_file - offset % units_per_file,
            commitlog_head=written,
        )

    def _queue_reader(self) -> ConsumeQueueReader:
        reader: ConsumeQueueReader | None = getattr(self._local, "queue_reader", None)
        if reader is None:
            reader = ConsumeQueueReader(
                self.fs, self.config.consume_queue_dir, mapped_file_size=self.config.mapped_file_size_consume_queue_bytes
            )
            self._local.queue_reader = reader
            self._local.queue_maps_generation = self._queue_maps_generation
            with self._readers_lock:
                self._readers.add(reader)
        elif self._local.queue_maps_generation != self._queue_maps_generation:
            self._local.queue_maps_generation = self._queue_maps_generation
            reader.forget()
        return reader

    def _on_queue_bounds(self, published: QueueBounds | None) -> None:
        """Called in the ConsumeQueue actor's thread: cheap, never blocks."""
        with self._arrival_cond:
            if published is None:
                self._queue_bounds_live = False
                self._queue_bounds = {}
                self._queue_maps_generation += 1
                return
            table = self._queue_bounds
            if published.complete:
                table = self._queue_bounds = {}
                self._queue_maps_generation += 1
            for key, (min_offset, max_offset) in published.bounds.items():
                previous = table.get(key)
                if previous is not None and min_offset > previous[0]:
                    self._queue_maps_generation += 1  # files below the new min may be deleted
                table[key] = (min_offset, max_offset)
            self._queue_units_written = published.dispatched_offset
            self._queue_bounds_live = True

    def min_offset(self, topic: str, queue_id: int) -> int:
        bounds = self._published_bounds(topic, queue_id, all_dispatched=True)
        return bounds[0] if bounds is not None else self._units(topic, queue_id, -1, 0).min_offset

    def max_offset(self, topic: str, queue_id: int) -> int:
        bounds = self._published_bounds(topic, queue_id, all_dispatched=True)
        return bounds[1] if bounds is not None else self._units(topic, queue_id, -1, 0).max_offset

    @records_get
    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        max_total_bytes: int | None = None,
        tags: str | None = None,
        raw: bool = False,
    ) -> GetResult:
        """getMessage (§13.1): every GetMessageStatus under RocketMQ's exact conditions. `tags`
        is a subscription expression ("A||B", "*"); the ConsumeQueue's tag hash filters first
        and the record's real tag confirms, so hash collisions never deliver a wrong tag.
        A thread reads its own writes: what it put is dispatched before its get runs."""
        self._await_own_writes()
        # The scan reads at most max(16000, maxMsgNums * 20) bytes of units (§13.1).
        max_units = max(800, max_count)
        if not raw and not self._puts_flowing():
            direct = self._units_direct(topic, queue_id, offset, max_units)
            if direct is not None and direct.units is not None:
                found = self._collect(direct.units, direct.commitlog_head, offset, max_count, max_total_bytes,
                                      tags, raw, {"min_offset": direct.min_offset, "max_offset": direct.max_offset},
                                      expect=(topic, queue_id))  # fmt: skip
                if found is not None:
                    return found
        try:
            reply = self._units(topic, queue_id, offset, max_units)
        except ServiceUnavailable:
            # 4.4.0 cannot reach NO_MATCHED_LOGIC_QUEUE (queues are created on demand); we
            # report it when the ConsumeQueue actor cannot answer (the store is closed, or the
            # actor crashed and is being restarted). Java would move the consumer to 0; a
            # transient outage must not rewind anyone, so the offset stays where it was.
            return GetResult(status=GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, next_begin_offset=offset)
        if not reply.exists:
            # 4.4.0 creates the queue on demand, so an unknown queue reads as an empty one.
            return GetResult(status=GetMessageStatus.NO_MESSAGE_IN_QUEUE, next_begin_offset=0)
        min_offset, max_offset = reply.min_offset, reply.max_offset
        common = {"min_offset": min_offset, "max_offset": max_offset}
        if max_offset == 0:
            return GetResult(status=GetMessageStatus.NO_MESSAGE_IN_QUEUE, next_begin_offset=0, **common)
        if offset < min_offset:
            return GetResult(status=GetMessageStatus.OFFSET_TOO_SMALL, next_begin_offset=min_offset, **common)
        if offset == max_offset:
            return GetResult(status=GetMessageStatus.OFFSET_OVERFLOW_ONE, next_begin_offset=offset, **common)
        if offset > max_offset:
            nxt = 0 if min_offset == 0 else max_offset
            return GetResult(status=GetMessageStatus.OFFSET_OVERFLOW_BADLY, next_begin_offset=nxt, **common)
        if reply.units is None:
            return GetResult(status=GetMessageStatus.OFFSET_FOUND_NULL, next_begin_offset=reply.next_file_offset, **common)
        result = self._collect(reply.units, reply.commitlog_head, offset, max_count, max_total_bytes, tags, raw, common)
        assert result is not None
        return result

    def _collect(
        self,
        units: bytes,
        head: int,
        offset: int,
        max_count: int,
        max_total_bytes: int | None,
        tags: str | None,
        raw: bool,
        common: dict[str, int],
        *,
        expect: tuple[str, int] | None = None,
    ) -> GetResult | None:
        """The messages the units point at (§13.1's loop). With `expect` (units read through
        this thread's maps), each record must be that (topic, queueId)'s at its queue offset,
        else None: the caller asks the actor, the owner, instead."""
        cfg = self.config
        reader = self._reader()
        wanted = _subscription(tags)
        in_memory_bytes = _TOTAL_RAM_BYTES * cfg.access_message_in_memory_max_ratio_percent // 100
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        found_raw: list[bytes] = []
        found: list[MessageRecord] = []
        count = total_bytes = 0
        next_phy_file_start = -1
        limit = max(16000, max_count * 20)
        unpack = codec.CQ_UNIT.unpack_from
        read_message = _read_in_place
        max_message_size = cfg.max_message_size_bytes
        i = 0
        while i < len(units) and i < limit:
            phy, size, tags_code = unpack(units, i)
            if size == _FILLER_SIZE and phy == 0:
                i += 20  # a queue offset whose record was lost or damaged: nothing to serve
                continue
            if next_phy_file_start >= 0 and phy < next_phy_file_start:
                i += 20
                continue
            in_disk = head - phy > in_memory_bytes
            if _batch_full(cfg, size, max_count, total_bytes, count, in_disk, max_total_bytes):
                break
            if wanted is not None and codec.to_int32(tags_code) not in wanted[0]:
                if total_bytes == 0:
                    status = GetMessageStatus.NO_MATCHED_MESSAGE
                i += 20
                continue
            # Raw mode hands out copies of the records; decoding reads them in place in the map.
            data = None
            if raw:
                data = reader.read(phy, size, limit=phy + size)
                place = None if data is None else (data, 0)
            else:
                place = reader.select(phy, size)
            if place is None:
                if total_bytes == 0:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                next_phy_file_start = phy + cfg.mapped_file_size_commitlog_bytes - phy % cfg.mapped_file_size_commitlog_bytes
                i += 20
                continue
            if wanted is not None or not raw:
                buf, pos = place
                try:
                    record = read_message(buf, pos, pos + size, max_message_size)
                except _Unmapped:
                    if total_bytes == 0:
                        status = GetMessageStatus.MESSAGE_WAS_REMOVING
                    i += 20
                    continue
                if expect is not None and (
                    record is None
                    or record.queue_offset != offset + i // 20
                    or record.queue_id != expect[1]
                    or record.topic != expect[0]
                ):
                    return None
                if record is None or (wanted is not None and record.tags not in wanted[1]):
                    if total_bytes == 0:
                        status = GetMessageStatus.NO_MATCHED_MESSAGE
                    i += 20
                    continue
                found.append(record)
            if data is not None:
                found_raw.append(data)
            count += 1
            total_bytes += size
            status = GetMessageStatus.FOUND
            next_phy_file_start = -1
            i += 20
        return GetResult(
            status=status,
            messages=tuple(found) if not raw else (),
            raw=tuple(found_raw) if raw else (),
            next_begin_offset=offset + i // 20,
            **common,
        )

    def query(
        self, topic: str, key: str, max_count: int = 32, begin_ms: int = 0, end_ms: int = 2**63 - 1
    ) -> QueryResult:
        """queryMessage (§13.2): messages whose UNIQ_KEY or a KEYS token equals `key`, stored
        within [begin_ms, end_ms], oldest first. Unlike the Java store, which leaves hash
        collisions to the client, each hit is checked against the record's real keys.
        The index files are read through this thread's own read-only maps (the index actor
        is asked only until it has published its files, or when they cannot be mapped)."""
        index_reader = self._index_reader()
        last_query_ms = end_ms
        messages: list[MessageRecord] = []
        last_ts = last_phy = 0
        reader = self._reader()
        for _ in range(3):
            offsets, ts, phy = self._index_offsets(index_reader, topic, key, max_count, begin_ms, last_query_ms)
            if not offsets:
                break
            last_ts, last_phy = ts, phy
            for n, phy in enumerate(sorted(offsets)):
                record = self._record_at(reader, phy)
                if record is None:
                    continue
                if n == 0:
                    last_query_ms = record.store_timestamp
                if record.topic == topic and (record.uniq_key == key or key in record.key_list):
                    messages.append(record)
            if messages or last_query_ms < begin_ms:
                break
        return QueryResult(
            messages=tuple(messages[:max_count]),
            index_last_update_timestamp=last_ts,
            index_last_update_phy_offset=last_phy,
        )

    def _index_offsets(
        self, index_reader: IndexReader | None, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
    ) -> tuple[Sequence[int], int, int]:
        """(commitlog offsets of `key`'s index hits, the newest file's endTimestamp and
        endPhyOffset): read from `index_reader`'s maps, else (None, or a map closed under the
        read) answered by the index actor."""
        if index_reader is not None:
            found = index_reader.query_offset(topic, key, max_num, begin_ms, end_ms)
            if found is not None:
                return found
        reply: QueryOffsetsReply = self._ask(
            "index", QueryOffsets(topic=topic, key=key, max_num=max_num, begin_ms=begin_ms, end_ms=end_ms)
        )
        return reply.offsets, reply.last_update_timestamp, reply.last_update_phy_offset

    def _index_reader(self) -> IndexReader | None:
        """This thread's index reader, mapping the files the index actor last published, once
        the index covers what a question to the actor would have found (`_index_target`);
        None when the actor must be asked instead: nothing published yet, not caught up in
        time, the store not running, or a file not mappable. Then the thread waits for
        dispatch only: the actor's inbox is FIFO, so the dispatch it was sent before the
        question is indexed before the answer."""
        if self._puts_flowing():  # give way to the puts (`_puts_flowing`): ask
            self._await_own_writes()
            return None
        target = self._index_target()
        progress = self._await_index(target)
        if progress is None or progress[1] < target or not self.running:
            self._await_own_writes()
            return None
        index_reader: IndexReader | None = getattr(self._local, "index_reader", None)
        if index_reader is None:
            cfg = self.config
            index_reader = IndexReader(
                self.fs,
                cfg.index_dir,
                max_hash_slot_num=cfg.max_hash_slot_num,
                max_index_num=cfg.max_index_num,
                max_msgs_num_batch=cfg.max_msgs_num_batch,
            )
            with self._readers_lock:
                if self._closed:
                    return None
                self._readers.add(index_reader)
            self._local.index_reader = index_reader
        return index_reader if index_reader.sync(progress[0]) else None

    def _index_target(self) -> int:
        """The commitlog offset the index must cover before this thread reads it: the end of
        the thread's last acknowledged put (read-your-writes), and everything dispatch has
        reported so far. A question to the actor queued behind every dispatch sent before it;
        so a query after `wait_for_messages`, a get, or a reopen's replay finds what they saw."""
        return max(getattr(self._local, "last_put_end", 0), self._dispatched_end)

    def _await_index(self, target: int, timeout_s: float = 5.0) -> tuple[tuple[str, ...], int] | None:
        """The index actor's last publication, once its indexed end reaches `target` (woken by
        the publication hook, never by polling), or the latest one after `timeout_s` or once
        the store closes. None if the actor has published nothing."""
        progress = self._index_progress
        if progress is None or progress[1] >= target:
            return progress
        deadline = time.monotonic() + timeout_s
        with self._index_cond:
            while True:
                progress = self._index_progress
                assert progress is not None
                remaining = deadline - time.monotonic()
                if progress[1] >= target or self._closed or remaining <= 0:
                    return progress
                self._index_cond.wait(remaining)

    def _on_index_progress(self, files: tuple[str, ...], indexed_end: int) -> None:
        """Called in the index actor's thread after each publication: cheap, never blocks long."""
        with self._index_cond:
            self._index_progress = (files, indexed_end)
            self._index_cond.notify_all()

    def _record_at(self, reader: CommitLogReader, offset: int) -> MessageRecord | None:
        """The message record at `offset`, decoded in place in the reader's map. Its own
        TOTALSIZE bounds it: within max_message_size and the segment, or None."""
        place = reader.select(offset, 4)
        if place is None:
            return None
        buf, pos = place
        try:
            return _read_in_place(buf, pos, None, self.config.max_message_size_bytes)
        except _Unmapped:
            return None

    def lookup(self, commitlog_offset: int) -> MessageRecord | None:
        """lookMessageByOffset (§13.3)."""
        return self._record_at(self._reader(), commitlog_offset)

    def lookup_msg_id(self, msg_id: str) -> MessageRecord | None:
        """The message an offset message id names (§2.5), if it is this store's."""
        host, offset = codec.decode_msg_id(msg_id)
        record = self.lookup(offset)
        return record if record is not None and record.store_host == host else None

    # offsets and times (§13.4, §9.5) ------------------------------------------------------
    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """getOffsetInQueueByTime (§9.5): the queue offset of the message stored at
        `timestamp_ms`, else its nearest neighbour (the earlier one on ties); before the first
        message the first offset, after the last the last one (not max); 0 if nothing."""
        return self._ask("consume_queue", GetOffsetByTime(topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms))

    def earliest_message_time(self, topic: str | None = None, queue_id: int | None = None) -> int:
        """getEarliestMessageTime (§13.4), -1 on failure. For a queue: the store time of its
        message at the min offset. For the store: the store time of the first record of the
        commitlog, which like 4.4.0 needs 2 * max_message_size_bytes readable from there."""
        reader = self._reader()
        if topic is None:
            if queue_id is not None:
                raise ValueError("queue_id needs a topic")
            head = self._units("", 0, -1, 0).commitlog_head  # dispatched data is readable
            start = reader.min_offset()
            size = 2 * self.config.max_message_size_bytes
            if start < 0 or start + size > head:
                return -1
            return pickup_store_timestamp(reader, start, size)
        if queue_id is None:
            raise ValueError("a topic needs its queue_id")
        reply = self._units(topic, queue_id, -1, 0)
        return self.message_store_time(topic, queue_id, reply.min_offset) if reply.max_offset > reply.min_offset else -1

    def message_store_time(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """getMessageStoreTimeStamp (§13.4): the store time of that unit's message, -1 on failure."""
        reply = self._units(topic, queue_id, queue_offset, 1)
        if not reply.units:
            return -1
        phy, size, _tags = codec.CQ_UNIT.unpack_from(reply.units, 0)
        return pickup_store_timestamp(self._reader(), phy, size)

    def get_commitlog_data(self, offset: int, max_bytes: int | None = None) -> tuple[int, bytes] | None:
        """getCommitLogData (§13.5), the replication source: (start offset, the bytes from
        `offset` up to the readable end of its segment), at most `max_bytes`. Offset 0 in a
        log whose first segment is gone reads from the first segment there is. None if the
        offset is not readable (deleted, or at/after the end of the log)."""
        writer: Any = self._ask("writer", Ping())
        readable_end = writer.max_offset
        reader = self._reader()
        seg = self.config.mapped_file_size_commitlog_bytes
        start = offset
        if offset == 0 and reader.read(0, 0, limit=0) is None:
            first = reader.min_offset()
            if first < 0:
                return None
            start = first  # returnFirstOnNotFound: from the first file's position 0
        end = min(start - start % seg + seg, readable_end)
        if max_bytes is not None:
            end = min(end, start + max_bytes)
        if start >= end:
            return None
        data = reader.read(start, end - start, limit=end)
        return (start, data) if data is not None else None

    # consumer offsets (§11.10) -------------------------------------------------------------
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Remember `group`'s next offset to consume in topic/queue_id. Persisted to
        <root>/config/consumerOffset.json within CONSUMER_OFFSET_PERSIST_INTERVAL_MS, and at close."""
        with self._offsets_lock:
            self._offsets.commit_offset(group, topic, queue_id, offset)
            self._offsets_dirty = True
            if self._offsets_thread is None and not self._closed:
                self._offsets_thread = threading.Thread(
                    target=self._persist_offsets_loop, name="mqstore-consumer-offsets", daemon=True
                )
                self._offsets_thread.start()

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 if `group` never committed one there."""
        with self._offsets_lock:
            return self._offsets.query_offset(group, topic, queue_id)

    def persist_offsets(self) -> None:
        """Write the consumer offsets now (string2File protocol: .tmp, .bak, rename)."""
        with self._offsets_lock:
            if not self._offsets_dirty:
                return
            self._offsets_dirty = False
            try:
                self._offsets.persist()
            except OSError:
                self._offsets_dirty = True  # retried by the next round or close
                raise

    def _persist_offsets_loop(self) -> None:
        while not self._offsets_stop.wait(CONSUMER_OFFSET_PERSIST_INTERVAL_MS / 1000):
            try:
                self.persist_offsets()
            except OSError as exc:
                self.log.error("persisting consumer offsets failed", error=str(exc))

    def _stop_offsets_timer(self) -> None:
        self._offsets_stop.set()
        thread = self._offsets_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        try:
            self.persist_offsets()
        except OSError as exc:
            self.log.error("persisting consumer offsets at close failed", error=str(exc))

    def stats(self) -> dict[str, Any]:
        """StoreStatsService's figures (§16) plus dispatch lag, process RSS/open files, disk use."""
        return store_snapshot(self)

    def flush(self) -> None:
        """Force the CommitLog (and the queues, index and checkpoint) to disk now."""
        # The writer's own word on where the log ends: its notices to the flush actor are
        # coalesced and may trail the last acknowledged put.
        writer = self._ask("writer", Ping())
        for peer in ("flush", "consume_queue", "index"):
            ref = self.supervisor.ctx.peers.get(peer)
            if ref is None:
                continue
            future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
            ref.tell(FlushAll(reply=Reply(future=future), up_to=writer.max_offset, store_timestamp=writer.store_timestamp))
            future.get(timeout=self._reply_timeout_s)

    def delete_expired_files_now(self) -> int:
        """executeDeleteFilesManually (§12.5): the next 20 cleaning rounds delete expired
        commitlog files at any hour (at any age above the forced-clean disk ratio); the first
        round runs now. Returns how many commitlog files it deleted (0 if the cleaner is down)."""
        from .messages import CleanRound, DeleteFilesManually

        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        if not self.supervisor.ctx.tell("cleaner", DeleteFilesManually(reply=Reply(future=future))):
            return 0
        try:
            result: CleanRound = future.get(timeout=self._reply_timeout_s)
        except (pykka.Timeout, ServiceUnavailable):
            return 0
        return result.commitlog_deleted

    # arrivals and long polling -------------------------------------------------------------
    def _on_arrivals(self, events: Iterable[MessageArrived], dispatched_end: int) -> None:
        """Called in the reput thread after each dispatch batch: cheap, never blocks."""
        events = list(events)
        with self._arrival_cond:
            if dispatched_end > self._dispatched_end:
                self._dispatched_end = dispatched_end
            for event in events:
                key = (event.topic, event.queue_id)
                if event.max_offset > self._arrived.get(key, 0):
                    self._arrived[key] = event.max_offset
            self._arrival_cond.notify_all()
        with self._subscribers_lock:
            subscribers = list(self._subscribers)
        for subscriber, topic, queue_id in subscribers:
            for event in events:
                if (topic is None or topic == event.topic) and (queue_id is None or queue_id == event.queue_id):
                    try:
                        subscriber.tell(event) if isinstance(subscriber, pykka.ActorRef) else subscriber(event)
                    except pykka.ActorDeadError:
                        self.unsubscribe(subscriber)
                        break

    def subscribe(self, subscriber: Any, topic: str | None = None, queue_id: int | None = None) -> None:
        """Be told `MessageArrived` (an actor ref is told; a callable is called in the
        dispatcher's thread and must return quickly)."""
        with self._subscribers_lock:
            self._subscribers.append((subscriber, topic, queue_id))

    def unsubscribe(self, subscriber: Any) -> None:
        with self._subscribers_lock:
            self._subscribers = [s for s in self._subscribers if s[0] is not subscriber]

    def _await_own_writes(self, timeout_s: float = 5.0) -> None:
        """Read-your-writes for the calling thread: wait until dispatch has passed the end of
        its last acknowledged put (RocketMQ dispatches asynchronously; an embedded user
        expects to get what it just put). Woken by the arrival hook, never by polling."""
        target = getattr(self._local, "last_put_end", 0)
        if target <= self._dispatched_end:
            return
        deadline = time.monotonic() + timeout_s
        with self._arrival_cond:
            while self._dispatched_end < target and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._arrival_cond.wait(remaining)

    def wait_for_messages(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Long polling: block until the queue has a message at `offset` (True) or the timeout
        passes (False). Woken by the dispatcher's arrival notice, never by polling."""
        key = (topic, queue_id)
        deadline = time.monotonic() + timeout_s
        with self._arrival_cond:
            if self._arrived.get(key, 0) > offset:
                return True
        if self.max_offset(topic, queue_id) > offset:
            return True
        with self._arrival_cond:
            while self._arrived.get(key, 0) <= offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return False
                self._arrival_cond.wait(remaining)
        return True


class _Unmapped(Exception):
    """The reader's map was closed between finding it and decoding (the store closing, or
    the segment removed): the record is as unreadable as if `select` had not found it."""


def _read_in_place(buf: Any, pos: int, limit: int | None, max_message_size: int) -> MessageRecord | None:
    """`codec.read_message` on a map of the reader's; _Unmapped if that map is closed."""
    try:
        return codec.read_message(buf, pos, limit, max_message_size=max_message_size)
    except ValueError as exc:
        if getattr(buf, "closed", False):
            raise _Unmapped from exc
        raise


def _subscription(tags: str | None) -> tuple[frozenset[int], frozenset[str]] | None:
    """A subscription expression as (tag hash codes, tag strings); None matches everything."""
    if tags is None or tags.strip() in ("", "*"):
        return None
    names = frozenset(t.strip() for t in tags.split("||") if t.strip())
    return frozenset(codec.java_string_hash(t) for t in names), names


_FILLER_SIZE = 0x7FFFFFFF  # the size of a filler unit (phy 0), as ConsumeQueue.FILLER_UNIT


def _batch_full(
    cfg: StoreConfig, size: int, max_count: int, total_bytes: int, count: int, in_disk: bool, max_total: int | None
) -> bool:
    """isTheBatchFull (§13.1), plus the caller's own byte limit."""
    if total_bytes == 0 or count == 0:
        return False
    if count >= max_count:
        return True
    if max_total is not None and total_bytes + size > max_total:
        return True
    if in_disk:
        return (
            total_bytes + size > cfg.max_transfer_bytes_on_message_in_disk
            or count > cfg.max_transfer_count_on_message_in_disk - 1
        )
    return (
        total_bytes + size > cfg.max_transfer_bytes_on_message_in_memory
        or count > cfg.max_transfer_count_on_message_in_memory - 1
    )


class StoreGateway(pykka.ThreadingActor):
    """The store's face for other pykka actors: typed requests in, typed replies out."""

    use_daemon_thread = True

    def __init__(self, store: MessageStore) -> None:
        super().__init__()
        self._store = store

    def on_receive(self, message: Any) -> Any:
        store = self._store
        match message:
            case Put(messages=messages, reply=reply, batch=batch):
                store.submit_put(messages, batch=batch, reply=reply)  # the writer answers `reply`
            case Get(topic=topic, queue_id=queue_id, offset=offset, max_count=n, reply=reply, tags=tags,
                     max_total_bytes=max_total):  # fmt: skip
                try:
                    reply.send(store.get(topic, queue_id, offset, n, tags=tags, max_total_bytes=max_total))
                except Exception as exc:
                    reply.fail(exc)
            case Query(topic=topic, key=key, max_count=n, reply=reply, begin_ms=begin, end_ms=end):
                try:
                    reply.send(store.query(topic, key, n, begin, end))
                except Exception as exc:
                    reply.fail(exc)
            case Subscribe(subscriber=subscriber, topic=topic, queue_id=queue_id):
                store.subscribe(subscriber, topic, queue_id)
            case Unsubscribe(subscriber=subscriber):
                store.unsubscribe(subscriber)
            case _:
                raise AssertionError(f"the store gateway cannot handle {message!r}")
        return None


@atexit.register
def _close_forgotten_stores() -> None:
    """A host that forgets close(): stop cleanly if it can, bounded, never hang the exit."""
    for store in list(_open_stores):
        try:
            store.close()
        except Exception:  # exiting anyway; the abort file makes the next start recover
            pass
