"""The embedded API: `mqstore.open(path)` gives a `MessageStore`, safe to use from many threads.

This module is lifecycle and delegation. Puts are encoded in the caller's thread
(`storage.put_encoding`) and told to the writer. Reads take the published `ReadView`
(`read_view.py`) once per call, after the read-your-writes wait, and run the read logic of
`reads.py` through the calling thread's own read-only maps; an owner actor is asked only for
what the view cannot decide. Consumer offsets are a tick-driven component (`offsets.py`).
`MessageStore.actor_ref` is the same store for pykka actors: send it
`mqstore.messages.Put/Get/Query/Subscribe/Unsubscribe` (the actor protocol, stated and typed
in `mqstore.messages`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from concurrent.futures import Future
from typing import Any, Callable, Final, Iterable, Iterator, Unpack

import pykka


from .actors.base import ServiceUnavailable, StoppedBeforeHandling
from .config import StoreConfig, StoreSettings
from .errors import StoreClosedError
from .faults import NO_FAULTS, FaultPlan
from .log import RepeatedLog, get_logger
from .put_pipeline import ActorClient, PutPipeline
from .messages import (
    Asked,
    CleanUnusedTopics,
    EncodedPut,
    FlushAll,
    ClaimTopicDirectory,
    GetOffsetByTime,
    TopicDirectoryRefused,
    GetResult,
    GetUnits,
    Message,
    MessageArrived,
    StoreRef,
    checked_message,
    plain_messages,
    GetWriterStatus,
    WriterReady,
    PutResult,
    QueryOffsets,
    QueryOffsetsReply,
    QueryResult,
    RefusePutsOutside,
    RemoveQueuesFromTopicQueueTable,
    Reply,
    Subscriber,
    UnitsReply,
    Waiter,
    host_reply_refusal,
)
from . import reads
from .offsets import ConsumerOffsets
from .read_view import COMMITLOG, INDEX, QUEUES, ReadView, in_ranges
from .storage import codec
from .storage.codec import MessageRecord, check_str
from .storage.commitlog import CommitLogReader, SegmentReplacedError
from .storage.disk import DiskGauge
from .storage.fs import FileSystem, RealFileSystem, UnreadPageError
from .storage.geometry import adopt_geometry
from .storage.index import IndexReader
from .storage.lockfiles import StoreDirectoryError, StoreLockedError, held_in_this_process
from .storage.put_encoding import EncodedBatch, PutEncoder, PutRefused
from .storage.status import GetMessageStatus, PutMessageStatus
from .stats import FlushFailures, StatsTicker, StoreStats, StoreStatsSnapshot, records_get, store_snapshot
from .runtime import FollowingRef, StoreFuture, Subscriptions, taken_back_if_stopped, tell_and_await, tell_keeping_gil
from .supervisor import PAUSE_GRACE_S, Supervisor, SupervisorState, refuse_what_is_in_the_way
from .ticker import Ticker

__all__ = ["MessageStore", "StoreClosedError", "open_store"]

_REPLY_MARGIN_S = 10.0
# A `put` blocks on its answer in the same GIL-free stretch that hands it to the writer for at
# most this long (a pass answers in well under a millisecond); a slower answer is waited for
# in Python, after a check that the writer did not stop as it was told.
HAND_OVER_FIRST_WAIT_S: Final = 0.05
# How often `flush` looks for the next incarnation of an actor being restarted (a rare wait,
# bounded by the reply timeout; the supervisor publishes no event for it).
RESTART_POLL_S: Final = 0.01
# The stores this process has open and not finished closing (the exit handler and the fork hook).
_open_stores: "weakref.WeakSet[MessageStore]" = weakref.WeakSet()
# How long a gateway read (for an asker the store cannot name) waits for dispatch to move
# before it stops waiting for the puts answered before it (_covering_while_dispatch_moves):
# past the supervisor's longest restart back-off (1 s) and a slow dispatch batch (a batch
# making 1,000 new queues took 1.9 s: review 107 J2).
OTHERS_PUTS_WAIT_S: Final = 2.5

# Statuses a get answers at or past a queue's end: while dispatch is in flight (reput has
# handed records on that the queues have not published yet) they are decided again once the
# queues caught up, as an ask queued behind that dispatch would have been.
_AT_THE_END = frozenset(
    {GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_OVERFLOW_BADLY}
)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@contextlib.contextmanager
def _locked_first(fs: FileSystem, config: StoreConfig) -> Iterator[None]:
    """The open's refusals look at the files before the store is taken (a refusal changes no
    byte). If another store holds it, what they saw may be its files mid-write (a `.tmp` being
    renamed): StoreLockedError then, not an advice to move a live store's file aside."""
    try:
        yield
    except StoreDirectoryError as refusal:
        if held_in_this_process(fs, config.lock_path):  # asked first: no descriptor of it opened
            raise StoreLockedError(f"lock failed, store already started in this process: {config.lock_path}") from refusal
        if isinstance(fs, RealFileSystem):
            from .tools.inspect_cli import lock_state  # F_GETLK only asks: nothing is taken

            if lock_state(Path(config.lock_path).parent, config.commitlog_dir)["held"]:
                raise StoreLockedError(f"lock failed, store already started: {config.lock_path}") from refusal
        raise


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
    ticker: Ticker | None = None,
    **settings: Unpack[StoreSettings],
) -> MessageStore:
    """Open (or create) the store at `path` and start its actors. `settings` are StoreConfig
    keys (`flush_disk_type="SYNC_FLUSH"`, ...) applied over `config` (or the defaults, a
    config file and MQSTORE_* variables). `disk_gauge` is what the cleaner reads the disk
    level from (default: psutil over the store paths) and `cleaner_sleep_ms` its pause between
    two deletions (default: a real sleep); tests pass a FixedDiskGauge and a recording sleep.
    `ticker` is the monotonic time the actors pace by (default: the real one; tests pass a
    ManualTicker)."""
    _refuse_once_exiting()
    overrides = dict(settings)
    if path is not None:
        overrides["store_path_root_dir"] = os.fspath(path)
    if config is None:
        config = StoreConfig.load(overrides=overrides)
    elif overrides:
        config = config.replace(**overrides)
    # Absolute once, at open: the host may chdir() while the store runs (a relative path then
    # named other files: queue and index files were made under the new directory, and the
    # writer took its own segment for one another process had replaced; review 39 F3).
    absolute: dict[str, Any] = {"store_path_root_dir": os.path.abspath(config.root_dir)}
    if config.store_path_commitlog:
        absolute["store_path_commitlog"] = os.path.abspath(config.commitlog_dir)
    config = config.replace(**absolute)
    files = fs if fs is not None else RealFileSystem()
    with _locked_first(files, config):
        refuse_what_is_in_the_way(files, config)  # before the geometry is read from those files
    # The files decide the store's shape: adopt it, or refuse an explicit setting against it.
    config, _geometry = adopt_geometry(files, config)
    store = MessageStore(
        config,
        fs=fs,
        clock_ms=clock_ms,
        faults=faults,
        on_fatal=on_fatal,
        disk_gauge=disk_gauge,
        cleaner_sleep_ms=cleaner_sleep_ms,
        ticker=ticker,
    )
    store._start()
    if _exit_hook_ran:  # (a daemon thread's open, finished as the exit hook ran)
        store.close()
        _refuse_once_exiting()
    return store


def _check_queue(topic: object, queue_id: object) -> None:
    check_str("topic", topic)
    if not isinstance(queue_id, int) or isinstance(queue_id, bool):
        raise TypeError(f"queue_id must be an int, not {type(queue_id).__name__}")
    if queue_id < 0:
        raise ValueError(f"queue_id must be >= 0, not {queue_id}")


_JAVA_LONG_MAX: Final = (1 << 63) - 1


def _check_int(name: str, value: object, minimum: int) -> None:
    """TypeError for a non-int; ValueError below `minimum` or past a Java long (offsets,
    counts and times are longs on disk and in the C loops: OverflowError there otherwise)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not minimum <= value <= _JAVA_LONG_MAX:
        raise ValueError(f"{name} must be in [{minimum}, {_JAVA_LONG_MAX}], not {value}")


def _check_messages(messages: Sequence[object], argument: str) -> None:
    for message in messages:
        if not isinstance(message, Message):
            raise TypeError(f"{argument} must hold mqstore.Message values, not {type(message).__name__}")


class MessageStore:
    """A running store: RocketMQ 4.4.0's DefaultMessageStore for one process, safe to use from
    many threads. Open it with `mqstore.open(path, **settings)`; close it (or use `with`).

    Every read keeps the read contract (read-your-writes), stated once in the README
    ("The read contract", under Architecture).

    API mistakes raise: a wrong type TypeError naming the argument, an out-of-range value
    ValueError, any call after `close()` `StoreClosedError` (the README states the rule and its exceptions). Operating conditions (a full
    disk, an actor being restarted) are statuses."""

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
        ticker: Ticker | None = None,
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
            backend=self,
            ticker=ticker,
        )
        self.fs = self.supervisor.fs
        self.clock_ms = self.supervisor.clock_ms
        self.store_host = self.supervisor.store_host
        self.read_view = self.supervisor.ctx.read_view  # what the owners publish
        self._readers = reads.ReaderRegistry(self.fs, config, _monotonic_ms, self.read_view.current_segments)
        self._encoder = PutEncoder(self.store_host, config.max_message_size_bytes, claim_topic=self._claim_topic_dir)
        self._local = threading.local()  # last_put_end: the end of the thread's last stored put
        self._ryw_timeout_s = config.read_your_writes_timeout_ms / 1000
        # The host's repeated mistakes (a refused put_and_forget in a loop, a raising
        # done-callback or subscriber): in full once per kind, then a count (log.RepeatedLog).
        self.host_repeats = RepeatedLog(self.supervisor.ticker.now_ms)
        self._subscriptions = Subscriptions(self.host_repeats)
        self._reply_timeout_s = (config.sync_flush_timeout_ms + config.allocate_wait_timeout_ms) / 1000 + _REPLY_MARGIN_S
        # The supervised gateway's current incarnation, whichever it is (it may be restarted).
        self._actor_ref = FollowingRef(lambda: self.supervisor.peers.get("gateway"), "gateway")
        self._closed = False
        self._clean_stop = False
        self._close_lock = threading.RLock()  # one close() does the work (see close)
        self._clean_lock = threading.Lock()  # one clean_unused_topic at a time
        self._close_running = False  # under way, in the thread holding _close_lock
        self._close_finished = False  # every step ran (a close cut short is resumed by the next)
        self._closed_detail: str | None = None  # why, when not closed by close() (a fork's child)
        self._owner_pid = os.getpid()
        # RocketMQ's putMessage refuses every put on a SLAVE: its log is the master's, copied
        # by HA replication (which this store does not have).
        self._slave_refusal = (
            PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE,
                      detail="the store is a SLAVE (broker_role): puts are forbidden, its log comes from a master")
            if config.broker_role == "SLAVE" else None
        )  # fmt: skip
        self.log = get_logger("mqstore.store", store=config.store_path_root_dir)
        self.supervisor.ctx.on_arrivals = self._on_arrivals
        self.stats_service = StoreStats(self.clock_ms, elapsed_ms=self.supervisor.ticker.now_ms)  # StoreStatsService (§16)
        self._puts = PutPipeline(self)  # put_async futures, the actor client, the in-flight bound
        # Sampled every second by the supervisor's ticker; <root>/stats.msgpack every interval.
        self._stats_ticker = StatsTicker(self, self.supervisor.ticker)
        self.supervisor.ctx.on_tick_ms.append(self._stats_ticker)
        self.supervisor.ctx.on_tick_ms.append(self._release_deleted_files)
        self.supervisor.ctx.on_tick_ms.append(self._drop_stopped_subscribers)
        self.offsets = ConsumerOffsets(self.fs, config.store_path_root_dir, ticker=self.supervisor.ticker)
        self.supervisor.ctx.on_tick_ms.append(self.offsets)
        # Their last write under the lock also when the supervisor gives up (FAILED): after it,
        # another process may open the store, and this one's writes would go over its own.
        self.supervisor.before_unlock.append(self.offsets.close)

    # lifecycle ---------------------------------------------------------------------------
    def _start(self) -> None:
        no_effect = self.config.no_effect_settings()
        if no_effect:
            # Once per open, not per put: a broker.conf carries these for the broker's sake.
            self.log.warning("settings that have no effect in this store", settings=sorted(no_effect),
                             why=no_effect)  # fmt: skip
        with _locked_first(self.fs, self.config):
            self.offsets.refuse_what_is_in_the_way()  # before the store is taken: a refusal changes no byte
        self.supervisor.start()
        try:
            _open_stores.add(self)
            # Under the store's lock: read before it, a holder closing meanwhile could write
            # newer offsets that this store's close would then write over.
            self.offsets.load()  # unreadable files give an empty table and an error; I/O errors fail the open
        except BaseException:
            # A Ctrl-C too: the host gets no store object to close, so this open closes what it
            # started (review 86 F2: the store ran on, its lock held for the process's life).
            self.close()
            raise

    def close(self) -> bool:
        """Stop cleanly (dispatch caught up, everything flushed, abort file removed).
        Returns True if the stop was clean: False too when the committed consumer offsets
        could not be written, or a step of the close failed (logged). Idempotent: a second call
        returns the same, once the first has finished (from another thread: it waits, so that
        the store is free when it returns). From within the first (a done-callback it runs),
        it cannot wait for it, and returns False at once: the outcome is not known yet. A close cut
        short by a KeyboardInterrupt or SystemExit (or any exception raised into its thread as it
        waits for the shutdown: a timeout library's) raises it and leaves the store closed to
        calls; the next close() (the exit handler's too) finishes the stop from where it was cut."""
        self._closed = True  # calls are refused from here on
        if self._close_finished:
            return self._clean_stop
        # A done-callback on the completion thread while the close joins that thread: waiting
        # for the close would deadlock (each would wait for the other).
        if self._close_running and self._puts.on_completion_thread():
            return self._clean_stop
        # One close at a time: a close() from another thread waits for the one under way (then
        # finds it finished, or finishes it if that one was cut short), so that the store is free
        # when it returns. A `with` on a reentrant lock and a flag set and cleared with no call
        # between: no interruption can leave them claiming a close that is not under way (an
        # Event and a thread field could: review 28).
        with self._close_lock:
            if self._close_finished or self._close_running:  # finished meanwhile, or reentered from the close
                return self._clean_stop
            self._close_running = True
            try:
                return self._close()
            finally:
                self._close_running = False

    def _close(self) -> bool:
        """The close's steps in order. One that fails is logged and the close goes on: before,
        a failure (or a Ctrl-C) in a step before the supervisor's stop left every actor running
        and the lock held, and every later close() did nothing (review 26). Each step is safe
        to run again, for a close resumed after an interruption."""
        failed: list[str] = []

        def step(name: str, run: Callable[[], object]) -> object:
            try:
                return run()
            except Exception as exc:  # not KeyboardInterrupt/SystemExit: those stop the close here
                self.log.error("a step of the close failed", step=name, error=repr(exc))
                failed.append(name)
                return None

        if self.supervisor.state is SupervisorState.RUNNING:
            step("stats snapshot", self._stats_ticker.close)  # the last of this run, while the lag is known
        # Committed offsets before the stop releases the store's lock (after it, another
        # process may have opened the store and written its own); not written: not clean.
        offsets_kept = step("consumer offsets", self.offsets.close)
        # Not a step: the stop only queues its request and waits for the shutdown, so what it
        # raises was raised into this thread as it waited (a timeout library's exception), as a
        # Ctrl-C is: the close is cut short there and the next one finishes it. Taken for a
        # failed step, the close went on while the shutdown ran, said False, and completed
        # pending futures the writer might still store (review 85 F9).
        stopped_clean = self.supervisor.stop()
        step("subscriptions", self._subscriptions.close)
        step("pending put futures", self._puts.close)  # after the writer: every future handed out is completed
        step("repeated lines' counts", lambda: self.host_repeats.flush(self.log))
        self.read_view.close()  # wakes every waiting reader
        self._readers.close()
        self._clean_stop = offsets_kept is True and stopped_clean is True and not failed
        # Finished before it leaves the open stores: a fork between the two finds it one way or
        # the other, never open and unfinished (its close there waited on the parent's lock).
        self._close_finished = True
        _open_stores.discard(self)
        return self._clean_stop

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        """Whether the store takes puts and reads (False once closed or stopped by its supervisor)."""
        return self.supervisor.state is SupervisorState.RUNNING and not self._closed

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    @property
    def actor_ref(self) -> StoreRef:
        """The store as a pykka actor: tell it Put/Get/Query/Subscribe/Unsubscribe (StoreRef:
        mypy refuses anything else). Follows the supervised gateway across its restarts; a
        tell while it restarts raises ActorDeadError.
        StoreClosedError once closed, or once the supervisor gave up (nothing answers then)."""
        self._check_open()
        self._check_not_failed()
        return self._actor_ref

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(self._closed_detail or f"the store at {self.config.store_path_root_dir} is closed")

    # put ---------------------------------------------------------------------------------
    def put(self, message: Message) -> PutResult:
        """putMessage (§6): store one message; PUT_OK once the writer appended it (under
        SYNC_FLUSH once it is on disk). Refusals are statuses with a `detail`."""
        self._check_open()
        return self._put_and_wait((checked_message(message),), batch=False)

    def put_batch(self, messages: Sequence[Message]) -> PutResult:
        """Put messages of one topic and queue as one contiguous batch (RocketMQ's putMessages):
        consecutive queue offsets, never split across segments, one result."""
        return self._put_and_wait(self._batch(messages), batch=True)

    def _batch(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """The argument checks of put_batch and put_batch_async (on an open store)."""
        self._check_open()
        if isinstance(messages, (Message, str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a sequence of mqstore.Message, not {type(messages).__name__}")
        _check_messages(messages, "messages")
        if not messages:
            raise ValueError("messages must not be empty")
        return plain_messages(messages)

    def _put_and_wait(self, messages: tuple[Message, ...], *, batch: bool) -> PutResult:
        started_ns = time.monotonic_ns()
        checked = self._encode(messages, batch)
        if isinstance(checked, PutResult):
            return checked  # refused before the writer: not a put in the stats
        waiter = Waiter()
        reply: Reply[PutResult] = Reply(future=waiter)
        put = self._encoded_put(messages, batch, checked, reply)
        writer = self.supervisor.ctx.peers.get("writer")
        told = tell_and_await(writer, put, waiter, HAND_OVER_FIRST_WAIT_S) if writer is not None else None
        if told is None:  # the writer is down (being restarted), or no C extension
            down = self._tell_put(put)
            result = down if down is not None else self._wait(waiter)
        elif told or writer is None or not taken_back_if_stopped(writer, put):
            result = self._wait(waiter)  # answered (at once), or the writer (or its drain) has it
        else:  # stopped as it was told, and taken back out of its dead inbox: nobody has it
            result = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail="writer is restarting")
            reply.send(result)
        self.stats_service.record_put(messages[0].topic, result, time.monotonic_ns() - started_ns)
        return result

    # pipelined puts (put_pipeline.py) ----------------------------------------------------------
    def put_async(self, message: Message) -> Future[PutResult]:
        """Put without waiting: encoded in this thread, answered through the future (completed
        on the store's completion thread, where its done-callbacks run; never the writer's).
        Operating errors are results (SERVICE_NOT_AVAILABLE, OS_PAGE_CACHE_BUSY when
        `max_puts_in_flight` is reached with `put_fail_fast_when_in_flight_full`), not
        exceptions. `flush()` waits for every future handed out before it. Read-your-writes:
        once this thread has seen its newest future done, its reads cover that put."""
        if self._closed:  # `_check_open`, inline: once per put
            self._check_open()
        return self._puts.put_async(checked_message(message))

    def put_batch_async(self, messages: Sequence[Message]) -> Future[PutResult]:
        """`put_batch` without waiting: one future for the batch."""
        return self._puts.put_batch_async(self._batch(messages))

    def actor_client(self, sender: pykka.ActorRef[Any]) -> ActorClient:
        """Puts for the pykka actor `sender`, told straight to the writer (no gateway hop);
        answers arrive in its inbox as `Replied(correlation_id, PutResult)` (put_pipeline.ActorClient)."""
        self._check_open()
        return ActorClient(self._puts, sender)

    def submit_put(self, messages: Sequence[Message], *, batch: bool, reply: Reply[PutResult] | None = None) -> Waiter | PutResult:
        """Encode here, tell the writer, return at once: a waiter for the answer (or the early
        result when the put was refused before reaching the writer). With `reply`, the answer
        goes there (and stats are recorded when it arrives)."""
        self._check_open()
        if reply is not None and (why_not := host_reply_refusal(reply)) is not None:
            raise TypeError(f"submit_put: {why_not}")
        messages = plain_messages(messages)
        started_ns = time.monotonic_ns()
        waiter: Waiter | None = None
        if reply is None:
            waiter = Waiter()
            reply = Reply(future=waiter)
        # Held before it is encoded (review 128 F5: refused only after its encoding, the
        # gateway fell behind a producer faster than the disk and its own inbox grew instead),
        # by its bodies' size: the records' headers are not counted.
        held = self._puts.hold_for_gateway(_bodies_bytes(messages))
        if isinstance(held, PutResult):  # in flight at the bound: refused, as it would be elsewhere
            self.stats_service.record_put(messages[0].topic, held, time.monotonic_ns() - started_ns)
            reply.send(held)
            return held
        try:
            checked = self._encode(messages, batch)
        except BaseException:
            held()
            raise
        if isinstance(checked, PutResult):
            held()
            reply.send(checked)
            return checked
        if reply.actor is not None:  # the gateway's Put: the actor's next read reflects it
            reply = self._puts.noting_reply(reply, reply.actor)
        answered = self.stats_service.timed_reply(messages[0].topic, reply, started_ns)

        def give_back(answer: Any) -> None:
            held()
            if isinstance(answer, Exception):
                answered.fail(answer)
            else:
                answered.send(answer)

        told = False
        try:
            down = self._tell_writer(messages, batch, checked, Reply(callback=give_back, store_internal_callback=True))
            told = True
        finally:
            if not told:  # (an exception raised into the gateway's thread: nothing will answer)
                held()
        if down is not None:
            return down
        return waiter if waiter is not None else PutResult(status=PutMessageStatus.PUT_OK, detail="submitted")

    def _encode(self, messages: Sequence[Message], batch: bool) -> PutResult | EncodedBatch:
        if self._closed or self.supervisor.state is not SupervisorState.RUNNING:  # `running`, inline: once per put
            return PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=self._gave_up_detail() or "store is not running")
        if self._slave_refusal is not None:
            return self._slave_refusal
        encoded = self._encoder.encode(messages, batch, self.clock_ms())
        if isinstance(encoded, PutRefused):
            return PutResult(status=encoded.status, detail=encoded.detail)
        return encoded  # (records, sys_flag, sync_wait)

    def _tell_writer(
        self,
        messages: Sequence[Message],
        batch: bool,
        checked: tuple[tuple[bytes, ...], int, bool],
        reply: Reply[PutResult],
        *,
        keep_gil: bool = False,
    ) -> PutResult | None:
        """Hand the encoded put to the writer, which answers `reply`; if the writer is down
        (being restarted), answer `reply` with SERVICE_NOT_AVAILABLE here and return that.
        `keep_gil`: the caller does not wait for the answer and keeps running (put_async):
        waking the writer without handing it the GIL lets puts pile up for one pass instead
        of a switch to the writer per put (one thread's put_async: ~15k -> ~20k msgs/s on the
        shared 2-vCPU machine, measured before the writer grouped puts by queue). A caller
        that waits for its answer (`put`) hands the GIL over: keeping it measured slower."""
        put = self._encoded_put(messages, batch, checked, reply)
        if keep_gil:
            writer = self.supervisor.ctx.peers.get("writer")
            if writer is not None and tell_keeping_gil(writer, put):
                return None
        return self._tell_put(put)

    @staticmethod
    def _encoded_put(
        messages: Sequence[Message], batch: bool, checked: tuple[tuple[bytes, ...], int, bool], reply: Reply[PutResult]
    ) -> EncodedPut:
        records, sys_flag, sync_wait = checked
        first = messages[0]
        # Positional (records, topic, queue_id, sys_flag, batch, sync_wait, reply, enqueued_ns):
        # one is built per put.
        return EncodedPut(records, first.topic, first.queue_id, sys_flag, batch, sync_wait, reply, time.monotonic_ns())

    def _tell_put(self, put: EncodedPut) -> PutResult | None:
        """Tell the writer `put`; if it is down (being restarted), answer the put's reply with
        SERVICE_NOT_AVAILABLE here and return that."""
        if not self.supervisor.ctx.tell("writer", put):
            result = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail="writer is restarting")
            put.reply.send(result)
            return result
        return None

    def _wait(self, submitted: Waiter | PutResult) -> PutResult:
        if isinstance(submitted, PutResult):
            return submitted
        try:
            try:
                result: PutResult = submitted.get(timeout=self._reply_timeout_s)
            except pykka.Timeout:
                # A pause (SIGSTOP, a suspended VM) or a host thread holding the GIL runs the
                # clock, not the writer: its answer comes a moment after the resume (review 78
                # M3: a stored, flushed put answered "not stored", and a retry stored it twice).
                result = submitted.get(timeout=PAUSE_GRACE_S)
            if result.stored:
                self._local.last_put_end = result.commitlog_offset + result.wrote_bytes
            return result
        except pykka.Timeout:
            return PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail="no answer from the writer in time")
        except ServiceUnavailable as exc:
            return PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=str(exc))

    # the read contract ---------------------------------------------------------------------
    def _own_put_end(self) -> int:
        """The commitlog offset just past the calling thread's last stored put (0: none)."""
        # The thread's own attributes as a dict: getattr with a default on a thread-local
        # raises and catches AttributeError for each one a thread never set (0.4 us each).
        local = self._local.__dict__
        end: int = local.get("last_put_end", 0)
        end = max(end, local.get("reading_for_end", 0))  # a gateway reader's actor, an aio read's loop
        end = max(end, local.get("seen_put_end", 0))  # put_async results this thread saw stored
        future = local.get("last_async_put")  # the thread's newest put_async
        if future is not None and future.done():
            result: PutResult = future.result()
            if result.stored:
                # Its pass's end, not its own: the pass appended queue by queue, and an older
                # put of this thread may lie after it (a read missed it: the model test).
                end = max(end, result.commitlog_offset + result.wrote_bytes, future.pass_end)
        return end

    @contextlib.contextmanager
    def reading_for(self, actor: pykka.ActorRef[Any] | None) -> Iterator[None]:
        """Reads in this block (a gateway reader's thread) follow `actor`'s read-your-writes:
        they reflect every put of `actor` answered as stored before they started. Without an
        actor (an answer to a future or a callback), whose puts they should reflect cannot be
        told: they reflect every put answered as stored before they started, a get where it
        finds a queue's end, a query always (review 103 M1: the put just answered to a future
        was missing from the next Get ~96% of the time)."""
        if actor is not None:
            with self.reading_after(self._puts.actor_put_end(actor)):
                yield
            return
        self._local.reading_at_end = self.read_view.acked_end
        self._local.reading_for_someone = True
        try:
            yield
        finally:
            self._local.reading_at_end = 0
            self._local.reading_for_someone = False

    @contextlib.contextmanager
    def reading_after(self, end: int) -> Iterator[None]:
        """Reads in this block, in this thread, reflect the log up to `end` (read for someone
        else: an actor through the gateway, a coroutine through mqstore.aio)."""
        self._local.reading_for_end = end
        self._local.reading_for_someone = True
        try:
            yield
        finally:
            self._local.reading_for_end = 0
            self._local.reading_for_someone = False

    def _view_covering(
        self, covers: Callable[[ReadView], bool], wakes_on: int, timeout_s: float | None = None
    ) -> ReadView | None:
        """The read view once `covers(view)` holds, waiting at most read_your_writes_timeout_ms
        (or `timeout_s`; woken by the owners' publications of `wakes_on`); None if it did not in
        time, or at once if the store stopped running (its supervisor gave up: nothing will
        publish again)."""
        view = self.read_view.view
        if covers(view):
            return view
        if not self.running:
            return None
        return self.read_view.await_view(covers, self._ryw_timeout_s if timeout_s is None else timeout_s, wakes_on)

    def _covering_while_dispatch_moves(
        self, covers: Callable[[ReadView], bool], wakes_on: int, progress: Callable[[ReadView], int]
    ) -> ReadView | None:
        """`_view_covering` for a read waiting for the puts answered before it by an asker the
        store cannot name (reading_for): up to read_your_writes_timeout_ms while `progress`
        moves, None once it has not moved for OTHERS_PUTS_WAIT_S. The gateway's few readers
        serve every actor client: a whole timeout each while dispatch stalled held every other
        gateway read behind them (review 105 G1: a FOUND read waited 10 s behind 4 polls), and
        a flat 200 ms answered a client's own put "not readable now" when dispatch was merely
        slow (review 106 H2: 3-4 reads in 3,000 under load)."""
        deadline = time.monotonic() + self._ryw_timeout_s
        seen = progress(self.read_view.view)
        while True:
            left = deadline - time.monotonic()
            view = self._view_covering(covers, wakes_on, max(min(OTHERS_PUTS_WAIT_S, left), 0.0))
            if view is not None or left <= OTHERS_PUTS_WAIT_S:
                return view
            now = progress(self.read_view.view)
            if now <= seen:
                return None  # dispatch did not move: stalled, not slow
            seen = now

    def _covering_for_this_read(
        self, covers: Callable[[ReadView], bool], wakes_on: int, progress: Callable[[ReadView], int]
    ) -> ReadView | None:
        """`_view_covering`, or for a read for someone else (`reading_for`, `reading_after`:
        the gateway's few readers serve every actor client, mqstore.aio) the wait that stops
        once `progress` does not move (reviews 105 G1, 109 K3, 112 Q1: behind a stuck owner, a
        whole timeout each held another client's FOUND read 10 s), whether or not the asker
        ever put (review 114 F3: a consumer actor that never put, polling a queue's end, held a
        reader the whole timeout)."""
        if self._local.__dict__.get("reading_for_someone"):
            return self._covering_while_dispatch_moves(covers, wakes_on, progress)
        return self._view_covering(covers, wakes_on)

    def _queue_view(self, *, with_dispatched: bool = False, at_least: int = 0) -> ReadView | None:
        """The view for a queue read: its queue bounds cover the thread's own last put and
        `at_least` (and, `with_dispatched`, everything dispatch had handed on when the read
        started). A thread that put nothing takes the view as it is (if the queues are not
        live, the owner is asked)."""
        target = max(self._own_put_end(), at_least)
        if with_dispatched:
            target = max(target, self.read_view.view.dispatched_end)
        if target == 0:
            return self.read_view.view
        return self._covering_for_this_read(
            lambda v: v.queues_live and v.queues_written >= target, QUEUES, lambda v: v.queues_written)

    def _ask(self, peer: str, message: Any) -> Any:
        ref = self.supervisor.ctx.peers.get(peer)
        if ref is None or not self.running:
            raise ServiceUnavailable(self._gave_up_detail() or f"{peer} is not running")
        waiter = Waiter()
        try:
            ref.tell(Asked(message, Reply(future=waiter)))
            return waiter.get(timeout=self._reply_timeout_s)
        except (pykka.ActorDeadError, pykka.Timeout) as exc:
            raise ServiceUnavailable(f"{peer} did not answer: {exc}") from exc

    def _claim_topic_dir(self, topic: str) -> PutRefused | None:
        """A topic's first put in this store's life waits for the ConsumeQueue actor to make
        its directory: a name the filesystem cannot give it (case-insensitive filesystems, vfat's
        reserved characters) refuses the put, where taking it stopped all dispatch after the
        put was acknowledged (and let two topics write one queue's files)."""
        try:
            refused: TopicDirectoryRefused | None = self._ask("consume_queue", ClaimTopicDirectory(topic=topic))
        except (ServiceUnavailable, OSError) as exc:  # the actor restarting, or failing in the check
            return PutRefused(PutMessageStatus.SERVICE_NOT_AVAILABLE, f"a new topic's directory cannot be made now: {exc}")
        if refused is None:
            return None
        status = PutMessageStatus.MESSAGE_ILLEGAL if refused.illegal else PutMessageStatus.SERVICE_NOT_AVAILABLE
        return PutRefused(status, refused.detail)

    def _units(self, topic: str, queue_id: int, offset: int, max_units: int) -> UnitsReply:
        reply: UnitsReply = self._ask("consume_queue", GetUnits(topic=topic, queue_id=queue_id, offset=offset, max_units=max_units))
        return reply

    # reads -------------------------------------------------------------------------------
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
        """getMessage (§13.1): up to `max_count` messages of topic/queue_id from queue offset
        `offset`, with every GetMessageStatus under RocketMQ's exact conditions. `tags` is a
        subscription expression ("A||B", "*"); the ConsumeQueue's tag hash filters first and
        the record's real tag confirms, so hash collisions never deliver a wrong tag. `raw`
        gives the records' bytes instead of decoded messages. Reads the caller's own writes
        (see the class docstring); NO_MATCHED_LOGIC_QUEUE (with a `detail`, the offset kept) when
        the queue cannot be read now (read-your-writes timeout, the ConsumeQueue actor
        restarting, the queues held behind what dispatch handed them)."""
        self._check_open()
        if not (type(topic) is str and type(queue_id) is int and queue_id >= 0 and type(offset) is int
                and 0 <= offset <= _JAVA_LONG_MAX and type(max_count) is int and 1 <= max_count <= _JAVA_LONG_MAX
                and max_total_bytes is None and tags is None):  # fmt: skip
            _check_queue(topic, queue_id)  # (a plain read in order passes all of them in one test)
            _check_int("offset", offset, 0)
            _check_int("max_count", max_count, 1)
            if max_total_bytes is not None:
                _check_int("max_total_bytes", max_total_bytes, 1)
            if tags is not None and not isinstance(tags, str):
                raise TypeError(f"tags must be a str or None, not {type(tags).__name__}")
        view = self._queue_view()
        if view is None:
            return self._not_readable(offset, self._gave_up_detail() or "dispatch did not reach this thread's last put in time")
        readers = self._readers.get()
        found = reads.get_from_view(view, readers, self.config, topic, queue_id, offset, max_count,
                                    max_total_bytes=max_total_bytes, tags=tags, raw=raw,
                                    on_corrupt=self._corrupt_on_read)  # fmt: skip
        if (
            found is not None
            and found.status in _AT_THE_END
            and max(view.dispatched_end, at_end := self._local.__dict__.get("reading_at_end", 0)) > view.queues_written
            and self._put_pending_for(view, topic, queue_id)
        ):  # fmt: skip
            waited_from = time.monotonic()
            later = self._queue_view(with_dispatched=True, at_least=at_end)
            if later is None and at_end > self.read_view.view.queues_written:
                return self._not_readable(offset, self._gave_up_detail() or (
                    "dispatch did not reach the puts answered as stored before this read in time: ask again"))  # fmt: skip
            if later is None:
                # The queues stay behind what dispatch handed them (held for disk space, after a
                # crash on a full disk: review 46 M4): "no message" would be a guess, and a
                # consumer moves its offset on it. Not readable now, the offset kept.
                behind = self.read_view.view
                return self._not_readable(offset, self._gave_up_detail() or (
                    f"the queues are behind the log ({behind.dispatched_end - behind.queues_written} dispatched bytes "
                    f"not in them after {round((time.monotonic() - waited_from) * 1000)} ms: held by a full disk or a queue file that "
                    "cannot be made, see the log and stats() consume_queue_behind_bytes); messages at this offset may "
                    "exist: ask again"))  # fmt: skip
            found = reads.get_from_view(later, readers, self.config, topic, queue_id, offset, max_count,
                                        max_total_bytes=max_total_bytes, tags=tags, raw=raw,
                                        on_corrupt=self._corrupt_on_read)  # fmt: skip
        if found is not None:
            return found
        kwargs: dict[str, Any] = {"max_total_bytes": max_total_bytes, "tags": tags, "raw": raw,
                                  "on_corrupt": self._corrupt_on_read}  # fmt: skip
        try:
            reply = self._units(topic, queue_id, offset, reads.max_units(max_count))
        except ServiceUnavailable as exc:
            # 4.4.0 cannot reach NO_MATCHED_LOGIC_QUEUE (queues are created on demand); we
            # report it when the ConsumeQueue actor cannot answer (the store is closed, or the
            # actor crashed and is being restarted). Java would move the consumer to 0; a
            # transient outage must not rewind anyone, so the offset stays where it was.
            return self._not_readable(offset, str(exc))
        return reads.get_from_units(reply, readers, self.config, (topic, queue_id), offset, max_count,
                                    quarantined=self.read_view.view.quarantined, replaced=self.read_view.view.replaced,
                                    **kwargs)  # fmt: skip

    def _put_pending_for(self, view: ReadView, topic: str, queue_id: int) -> bool:
        """Whether a put the writer appended to this queue may be missing from `view`: its
        next queue offset there is past the view's bound. Read after the read started, the
        writer's table holds every put answered before it (it is updated before any answer), so
        a queue it says is in the view has nothing for a read at its end to wait for (review
        107 J1: gateway polls of a queue nobody writes waited out a slow dispatch, 5 s each,
        holding the gateway's readers)."""
        bounds = view.queue_bounds.get((topic, queue_id), (0, 0))
        return self.read_view.next_queue_offsets.get(f"{topic}-{queue_id}", 0) > bounds[1]

    @staticmethod
    def _not_readable(offset: int, detail: str) -> GetResult:
        return GetResult(status=GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, next_begin_offset=offset, detail=detail)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """getMinOffsetInQueue: the queue's first readable offset (0 for a queue that does not
        exist); -1 if it cannot be known now (read-your-writes timeout, owner restarting)."""
        bounds = self._queue_bounds(topic, queue_id)
        return bounds[0] if bounds is not None else -1

    def max_offset(self, topic: str, queue_id: int) -> int:
        """getMaxOffsetInQueue: one past the queue's last offset (0 for a queue that does not
        exist); -1 if it cannot be known now (read-your-writes timeout, owner restarting)."""
        bounds = self._queue_bounds(topic, queue_id)
        return bounds[1] if bounds is not None else -1

    def _queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        self._check_open()
        _check_queue(topic, queue_id)
        view = self._queue_view(with_dispatched=True)
        if view is None:
            return None
        bounds = reads.bounds_from_view(view, topic, queue_id)
        if bounds is not None:
            return bounds
        try:
            reply = self._units(topic, queue_id, -1, 0)
        except ServiceUnavailable:
            return None
        return reply.min_offset, reply.max_offset

    def query(
        self, topic: str, key: str, max_count: int | None = None, begin_ms: int = 0, end_ms: int = 2**63 - 1
    ) -> QueryResult:
        """queryMessage (§13.2): messages whose UNIQ_KEY or a KEYS token equals `key`, stored
        within [begin_ms, end_ms] (to the millisecond), each once: the newest `max_count` of
        them, oldest first; by default `default_query_max_num` (the limit RocketMQ's broker
        gives a query by key). Unlike the Java store, which leaves hash collisions to the
        client, each hit is checked against the record's real keys; a walk that other keys'
        hits cut short is made again with `max_msgs_num_batch`, and says so in `detail` if
        that is cut short too. The index files are read through this thread's own maps once
        the index covers the thread's last put and everything dispatched when the query
        started; if it does not in time, an empty result with a `detail`."""
        if self._closed:
            self._check_open()
        if not (type(topic) is str and type(key) is str):
            check_str("topic", topic)
            check_str("key", key)
        if max_count is None:
            max_count = self.config.default_query_max_num
        if not (type(max_count) is int and 1 <= max_count <= _JAVA_LONG_MAX and type(begin_ms) is int
                and 0 <= begin_ms <= _JAVA_LONG_MAX and type(end_ms) is int and 0 <= end_ms <= _JAVA_LONG_MAX):  # fmt: skip
            _check_int("max_count", max_count, 1)  # (the checks on a key lookup's path: one test when all is well)
            _check_int("begin_ms", begin_ms, 0)
            _check_int("end_ms", end_ms, 0)
        if not self.config.message_index_enable:
            return QueryResult(detail="message_index_enable is off: there is no index to query")
        now = self.read_view.view
        own_put_end = self._own_put_end()
        at_end: int = self._local.__dict__.get("reading_at_end", 0)  # (reading_for)
        target = max(own_put_end, now.dispatched_end, at_end)
        view: ReadView | None = now
        waited_from = time.monotonic()
        if now.index_files is None or now.indexed_end < target:
            view = self._covering_for_this_read(
                lambda v: v.index_files is not None and v.indexed_end >= target, INDEX, lambda v: v.indexed_end)
        if view is None:
            if at_end > max(own_put_end, now.dispatched_end):
                return QueryResult(detail=self._gave_up_detail() or (
                    "the index did not reach the puts answered as stored before this query in time: ask again"))  # fmt: skip
            if own_put_end >= now.dispatched_end:
                return QueryResult(detail=self._gave_up_detail() or "the index did not reach this thread's last put in time")
            behind = self.read_view.view
            return QueryResult(detail=self._gave_up_detail() or (
                f"the index is behind the log ({max(behind.dispatched_end - behind.indexed_end, 0)} dispatched bytes not "
                f"indexed after {round((time.monotonic() - waited_from) * 1000)} ms: held by a full disk or an index file that "
                "cannot be made, see the log and stats() index_behind_bytes); messages with this key may exist: ask "
                "again"))  # fmt: skip
        readers = self._readers.get()
        index_reader = readers.index_reader(view)
        commitlog = readers.commitlog_reader()
        quarantined = view.quarantined  # (`now` or newer: the quarantine only grows)
        if index_reader is not None and not quarantined and not view.replaced:
            walk = index_reader.walk_args
            direct = None if walk is None else reads.query_direct(walk, commitlog, self.config, topic, key, max_count,
                                                                  begin_ms, end_ms)  # fmt: skip
            if direct is not None and not commitlog.map_errors:
                try:
                    index_reader.raise_if_faulted()  # (its zeros read as no hits)
                except UnreadPageError as exc:
                    return QueryResult(detail=reads.index_unread_detail(exc))
                reads.yield_gil()
                return direct
            # (a segment could not be mapped: the reference names the hits it could not read)
        return self._query_reference(index_reader, commitlog, quarantined, topic, key, max_count, begin_ms, end_ms)

    def _query_reference(
        self, index_reader: IndexReader | None, commitlog: CommitLogReader, quarantined: tuple[tuple[int, int], ...],
        topic: str, key: str, max_count: int, begin_ms: int, end_ms: int,
    ) -> QueryResult:  # fmt: skip
        """The query `reads.query_direct` declined (or could not take): `reads.query_messages`
        over the thread's index maps, or the index actor's answers where they cannot be read."""

        def hits(topic: str, key: str, max_num: int, begin: int, end: int) -> tuple[Sequence[int], int, int]:
            if index_reader is not None:
                found = index_reader.query_offset(topic, key, max_num, begin, end)
                if found is not None:
                    return found
            reply: QueryOffsetsReply = self._ask(
                "index", QueryOffsets(topic=topic, key=key, max_num=max_num, begin_ms=begin, end_ms=end)
            )
            return reply.offsets, reply.last_update_timestamp, reply.last_update_phy_offset

        try:
            result = reads.query_messages(hits, commitlog, self.config, topic, key, max_count, begin_ms, end_ms,
                                          on_corrupt=self._corrupt_on_read, quarantined=quarantined,
                                          replaced=self.read_view.view.replaced)  # fmt: skip
        except ServiceUnavailable as exc:
            return QueryResult(detail=str(exc))
        except UnreadPageError as exc:  # a page of the thread's index map faulted
            return QueryResult(detail=reads.index_unread_detail(exc))
        reads.yield_gil()
        return result

    def lookup(self, commitlog_offset: int, size: int | None = None) -> MessageRecord | None:
        """lookMessageByOffset (§13.3): the message at that commitlog offset, or None. With
        `size` (lookMessageByOffset(offset, size), as a ConsumeQueue unit gives it), exactly
        `size` bytes are read: a record whose own TOTALSIZE disagrees is None and logged as an
        error (Java decodes whatever lies there), and the CRC is still checked. OSError when
        the segment holding it is there but cannot be mapped now (out of descriptors or
        memory), or another process replaced it under the running store: not knowing is not None."""
        self._check_open()
        _check_int("commitlog_offset", commitlog_offset, 0)
        if in_ranges(self.read_view.view.replaced, commitlog_offset):
            # The file at its path is not the log (review 145 F2: another store's record served).
            raise OSError(errno.EIO, reads.replaced_detail(commitlog_offset, self.config.mapped_file_size_commitlog_bytes))
        reader = self._readers.get().commitlog_reader()
        if size is not None:
            _check_int("size", size, 1)
            found = self._record_of_size(reader, commitlog_offset, size)
        else:
            found = reads.record_at(reader, commitlog_offset, self.config.max_stored_record_bytes,
                                    check_crc=self.config.check_crc_on_read, on_corrupt=self._corrupt_on_read,
                                    quarantined=self.read_view.view.quarantined)  # fmt: skip
        if found is None and (unmappable := reader.map_error(commitlog_offset)) is not None:
            # None would say "no message there" (review 52 H1): the caller learns why instead.
            raise OSError(getattr(unmappable, "errno", None) or errno.EIO, reads.unmappable_detail(
                commitlog_offset, unmappable, "whether a message is there is not known"))  # fmt: skip
        return found

    def _record_of_size(self, reader: CommitLogReader, commitlog_offset: int, size: int) -> MessageRecord | None:
        place = reader.select(commitlog_offset, size)  # all `size` bytes readable, in one segment
        if place is None:
            return None
        buf, pos = place
        try:
            total_size = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
        except ValueError:  # unmapped underneath (the segment was deleted)
            return None
        if total_size != size:
            if reader.unread(commitlog_offset) is not None:
                return None  # its page faulted: zeros, not a record of another size (lookup says why)
            if reader.drop_if_renewed(commitlog_offset):  # a map of the segment's earlier file
                return self._record_of_size(reader, commitlog_offset, size)
            # A unit or a caller's size that disagrees with the record: never serve the bytes
            # as another record (or a record cut short).
            self.log.error("lookup_size_disagrees_with_record", commitlog_offset=commitlog_offset, size=size,
                           record_total_size=total_size)  # fmt: skip
            return None
        return reads.record_at(reader, commitlog_offset, self.config.max_stored_record_bytes,
                               check_crc=self.config.check_crc_on_read, on_corrupt=self._corrupt_on_read,
                               quarantined=self.read_view.view.quarantined)  # fmt: skip

    def _corrupt_on_read(self, commitlog_offset: int, reason: str) -> None:
        """A record a read skipped because its body fails its CRC: logged and counted."""
        self.stats_service.record_corrupt_on_read()
        self.log.error("corrupt_record_on_read", commitlog_offset=commitlog_offset, reason=reason)

    def lookup_msg_id(self, msg_id: str) -> MessageRecord | None:
        """The message an offset message id names (§2.5), if it is this store's."""
        self._check_open()
        if not isinstance(msg_id, str):
            raise TypeError(f"msg_id must be a str, not {type(msg_id).__name__}")
        host, offset = codec.decode_msg_id(msg_id)
        record = self.lookup(offset)
        return record if record is not None and record.store_host == host else None

    # offsets and times (§13.4, §9.5) ------------------------------------------------------
    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """getOffsetInQueueByTime (§9.5): the queue offset of the message stored at
        `timestamp_ms`, else its nearest neighbour (the earlier one on ties); before the first
        message the first offset, after the last the last one (not max); 0 if nothing.
        -1 if it cannot be answered now (read-your-writes timeout, owner restarting). Read
        through the thread's maps once the view covers the put; the ConsumeQueue actor answers
        only what the view cannot decide."""
        self._check_open()
        _check_queue(topic, queue_id)
        _check_int("timestamp_ms", timestamp_ms, 0)
        view = self._queue_view()
        if view is None:
            return -1
        found = reads.offset_for_time(view, self._readers.get(), topic, queue_id, timestamp_ms)
        if found is not None:
            return found
        try:
            answer: int = self._ask("consume_queue", GetOffsetByTime(topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms))
        except ServiceUnavailable:
            return -1
        return answer

    def earliest_message_time(self, topic: str | None = None, queue_id: int | None = None) -> int:
        """getEarliestMessageTime (§13.4), -1 on failure. For a queue: the store time of its
        message at the min offset. For the store: the store time of the first record of the
        commitlog, which like 4.4.0 needs 2 * max_message_size_bytes readable from there."""
        self._check_open()
        if topic is not None:
            _check_queue(topic, 0 if queue_id is None else queue_id)
        if topic is None:
            if queue_id is not None:
                raise ValueError("queue_id needs a topic")
            view = self._queue_view()
            if view is None:
                return -1
            reader = self._readers.get().commitlog_reader()
            head = max(view.queues_written, view.dispatched_end)  # dispatched data is readable
            start = reader.min_offset()
            size = 2 * self.config.max_message_size_bytes
            if start < 0 or start + size > head:
                return -1
            return reads.pickup_store_timestamp(reader, start, size, view.replaced)
        if queue_id is None:
            raise ValueError("a topic needs its queue_id")
        bounds = self._queue_bounds(topic, queue_id)
        if bounds is None or bounds[1] <= bounds[0]:
            return -1
        return self.message_store_time(topic, queue_id, bounds[0])

    def message_store_time(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """getMessageStoreTimeStamp (§13.4): the store time of that unit's message, -1 on
        failure (outside the queue, the message deleted, or not answerable now)."""
        self._check_open()
        _check_queue(topic, queue_id)
        _check_int("queue_offset", queue_offset, 0)
        view = self._queue_view()
        if view is None:
            return -1
        readers = self._readers.get()
        found = reads.unit_store_time(view, readers, topic, queue_id, queue_offset)
        if found is not None:
            return found
        try:
            reply = self._units(topic, queue_id, queue_offset, 1)
        except ServiceUnavailable:
            return -1
        if not reply.units:
            return -1
        phy, size, _tags = codec.CQ_UNIT.unpack_from(reply.units, 0)
        return reads.pickup_store_timestamp(readers.commitlog_reader(), phy, size, self.read_view.view.replaced)

    def get_commitlog_data(self, offset: int, max_bytes: int | None = None) -> tuple[int, bytes] | None:
        """getCommitLogData (§13.5), the replication source: (start offset, the bytes from
        `offset` up to the readable end of its segment), at most `max_bytes`. Offset 0 in a
        log whose first segment is gone reads from the first segment there is. None if the
        offset is not readable (deleted, at/after the end of the log, or the writer's readable
        end did not reach the thread's last put in time). UnreadPageError (an OSError, EIO) if
        a page of it could not be read now (an I/O error): ask again once the disk reads.
        OSError (EIO) if its segment was replaced under the running store: another file's bytes."""
        self._check_open()
        _check_int("offset", offset, 0)
        if max_bytes is not None:
            _check_int("max_bytes", max_bytes, 1)
        target = self._own_put_end()
        view = self._view_covering(lambda v: v.readable_end >= target, COMMITLOG)
        if view is None:
            return None
        reader = self._readers.get().commitlog_reader()
        seg = self.config.mapped_file_size_commitlog_bytes
        start = offset
        if offset == 0 and reader.read(0, 0, limit=0) is None:
            first = reader.min_offset()
            if first < 0:
                return None
            start = first  # returnFirstOnNotFound: from the first file's position 0
        if in_ranges(view.replaced, start):
            # Another file's bytes there: a replica must not copy them (review 146 F2).
            raise OSError(errno.EIO, reads.replaced_detail(start, seg))
        end = min(start - start % seg + seg, view.readable_end)
        if max_bytes is not None:
            end = min(end, start + max_bytes)
        if start >= end:
            return None
        data = reader.read(start, end - start, limit=end)
        if data is not None and reader.drop_if_renewed(start):
            # A map of the segment's earlier file (deleted and made again at a writer restart)
            # read its zeros (review 69 F3): read the file named now. A stat per call.
            data = reader.read(start, end - start, limit=end)
        unread = reader.unread(start)  # (one compare while no map faulted)
        if unread is not None:
            # The guard's zeros, not the log (review 68 F3: a replica appended them, and this
            # thread served them on after the disk read again); the map is given back.
            raise unread
        if data is None and isinstance(replaced := reader.map_error(start), SegmentReplacedError):
            raise replaced  # (before the writer's check: another file at the path, review 148 F2)
        return (start, data) if data is not None else None

    # consumer offsets (§11.10) -------------------------------------------------------------
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Remember `group`'s next offset to consume in topic/queue_id. Persisted to
        <root>/config/consumerOffset.json by the supervisor's ticker within
        CONSUMER_OFFSET_PERSIST_INTERVAL_MS (offsets.py), and at close. StoreClosedError once
        the store stopped (closed, or its supervisor gave up): the offset would be kept nowhere."""
        self._check_open()
        if not isinstance(group, str):
            raise TypeError(f"group must be a str, not {type(group).__name__}")
        _check_queue(topic, queue_id)
        _check_int("offset", offset, 0)
        self.offsets.commit(group, topic, queue_id, offset)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 if `group` never committed one there. The same types as
        commit_offset (an Enum member answered -1, "never committed": review 28)."""
        self._check_open()
        check_str("group", group)
        _check_queue(topic, queue_id)
        return self.offsets.query(group, topic, queue_id)

    def persist_offsets(self) -> None:
        """Write the consumer offsets now (string2File protocol: .tmp, .bak, rename). OSError
        if they could not be (kept in memory, retried at the next tick). StoreClosedError once
        the store stopped (closed, or its supervisor gave up), saying whether its last write
        kept them."""
        self._check_open()
        self.offsets.persist()

    def stats(self) -> StoreStatsSnapshot:
        """StoreStatsService's figures (§16) plus dispatch lag, process RSS/open files, disk use."""
        self._check_open()
        return store_snapshot(self)

    def dispatch_progress(self) -> tuple[int, int]:
        """(the commitlog's readable end, the end of what reput dispatched), from the read
        view: their difference is the dispatch lag (stats). Answers after close too (the
        view as the actors left it), for the last stats snapshot."""
        view = self.read_view.view
        return view.readable_end, view.dispatched_end

    def written_progress(self) -> tuple[int | None, int | None]:
        """(every unit of a record below this offset is in its ConsumeQueue, every record
        below this one is indexed), from the read view; None: not published since the start
        (or the index is off). Stats report the log's end minus each."""
        view = self.read_view.view
        queues = view.queues_written if view.queues_live else None
        index = view.indexed_end if view.index_files is not None and self.config.message_index_enable else None
        return queues, index

    def flush_failures(self) -> FlushFailures:
        """What `stats()` says of failed msyncs in this run (review 49): the commitlog offset
        from which nothing counts as flushed (puts refused until a reopen; None: none failed),
        and whether a ConsumeQueue or index flush failed (the next open rebuilds them)."""
        ctx = self.supervisor.ctx
        return {"commitlog_flush_failed_at": ctx.commitlog_flush_failed_at,
                "queue_or_index_flush_failed": ctx.derived_flush_failed}  # fmt: skip

    def files_cut_under_map(self) -> list[str]:
        """The store's files another process cut short while it had them mapped, since it
        opened (the SIGBUS guard caught the touch: README, Guarantees); `stats()` lists them."""
        return self.supervisor.note_files_cut_under_map()

    def dispatch_behind_bytes(self) -> int:
        """dispatchBehindBytes: how many bytes of the commitlog reput has not dispatched yet
        (the writer's readable end minus reput's dispatched end, from the read view)."""
        self._check_open()
        view = self.read_view.view
        return max(view.readable_end - view.dispatched_end, 0)

    def flush(self) -> None:
        """Force the CommitLog (and the queues, index and checkpoint) to disk now, after
        every put_async future handed out before this call is done. An actor it needs that is
        being restarted is asked again once its next incarnation runs. TimeoutError if one
        did not answer in time, OSError if the commitlog could not be forced (an I/O error) or
        an actor failed handling the flush, StoreClosedError once the supervisor gave up or
        the store closes: then nothing is claimed forced (the next flush, or the close, tries
        again). TimeoutError too, after forcing the log as far as the writer had it, when
        put_async futures handed out before the call were not done in the reply timeout."""
        self._check_open()
        undone = self._puts.wait_handed_out(self._reply_timeout_s)
        deadline = time.monotonic() + self._reply_timeout_s
        # The writer's own word on where the log ends: its notices to the flush actor are
        # coalesced and may trail the last acknowledged put.
        writer: WriterReady = self._ask_through_restarts("writer", lambda reply: Asked(GetWriterStatus(), reply), deadline)
        running = {spec.name for spec in self.supervisor.specs}
        for peer in ("flush", "consume_queue", "index"):
            if peer in running:  # the index is not when message_index_enable is off
                reached = self._ask_through_restarts(
                    peer,
                    lambda reply: FlushAll(reply=reply, up_to=writer.max_offset, store_timestamp=writer.store_timestamp),
                    deadline,
                )
                if peer == "flush" and reached < writer.max_offset:
                    # Its msync failed (logged there): what it answers is how far it got.
                    raise OSError(errno.EIO, f"flush: the commitlog is forced to disk below offset {reached} only, "
                                             f"not to its end {writer.max_offset} (an I/O error: see the log)")  # fmt: skip
        if self.supervisor.ctx.derived_flush_failed:
            # Their retried flushes "succeed" without writing (review 49 M1: flush() said
            # nothing while the close would be unclean and the next open rebuild them).
            raise OSError(errno.EIO, "flush: a ConsumeQueue or index flush failed in this run (see the log); the "
                                     "commitlog holds every message, and the next open rebuilds them from it")  # fmt: skip
        if undone:
            # It returned as if it had waited (review 75 L2: 36 futures still pending, behind a
            # done-callback that waited for the event loop flush() was called on).
            raise TimeoutError(f"flush: {undone} put_async futures handed out before it were not done in "
                               f"{self._reply_timeout_s:.1f} s (a done-callback that waits? a held writer?); the log "
                               f"is forced as far as the writer had it")  # fmt: skip

    def _ask_through_restarts(self, peer: str, request: Callable[[Reply[Any]], Any], deadline: float) -> Any:
        """`request(reply)` told to `peer` and its answer. A peer being restarted (not among
        the peers, dead as it was told, or stopped before it took the request) is asked again,
        its next incarnation, until `deadline` (TimeoutError); OSError if it failed handling
        the request (not asked again: a request that crashes its actor would crash each next
        one, until the supervisor gave up); StoreClosedError once the supervisor gave up or
        the store is closing (its actors stop for good)."""
        while True:
            self._check_not_failed()
            if self._closed or self.supervisor.state in (SupervisorState.STOPPING, SupervisorState.STOPPED):
                raise StoreClosedError(f"the store at {self.config.store_path_root_dir} is closing")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{peer} did not answer within {self._reply_timeout_s:.0f} s (being restarted?)")
            ref = self.supervisor.ctx.peers.get(peer)
            if ref is not None:
                waiter = Waiter()
                message = request(Reply(future=waiter))
                try:
                    ref.tell(message)
                    while True:
                        try:
                            return waiter.get(timeout=min(left, RESTART_POLL_S * 10))
                        except pykka.Timeout:
                            # Stopped after pykka's alive check, before the message landed: it
                            # lies in a dead inbox. Taken back, the next incarnation is asked;
                            # else the actor (or its teardown) has it and answers.
                            if taken_back_if_stopped(ref, message):
                                break
                            left = deadline - time.monotonic()
                            if left <= 0:
                                raise TimeoutError(f"{peer} did not answer within {self._reply_timeout_s:.0f} s") from None
                except (pykka.ActorDeadError, StoppedBeforeHandling):
                    pass  # stopped before it took the request: its next incarnation is asked
                except ServiceUnavailable as exc:
                    raise OSError(errno.EIO, f"flush: {exc}") from exc
            # Between two incarnations: the supervisor starts the next within its back-off.
            time.sleep(RESTART_POLL_S)

    def clean_unused_topic(self, keep: Iterable[str]) -> int:
        """cleanUnusedTopic: destroy the ConsumeQueues (files and table entries) of every topic
        not in `keep`, except SCHEDULE_TOPIC_XXXX (4.4.0 keeps it whatever `keep` says), and
        forget their next queue offsets, so a later put to such a topic starts a new queue at
        offset 0. The messages stay in the commitlog (lookup, query) until it is cleaned.
        Returns how many queues were removed (4.4.0 returns 0 always). For topics no longer
        written: while it runs, a put to one is refused (SERVICE_NOT_AVAILABLE, unstored; in
        RocketMQ it may bring its queue back). The queue ledger keeps each removed queue's floor:
        its old records are never dispatched into it again (an actor's restart, a crash's
        re-dispatch, a reopen), and the ledger forgets the queues before their files go, so the
        next open does not take them for queues deleted by accident and rebuild them. It
        first waits (up to read_your_writes_timeout_ms) for dispatch to reach every put
        answered before it. If dispatch does not in time, the ConsumeQueue actor cannot answer
        (it is being restarted), or the ledger cannot be written, nothing is removed: 0."""
        self._check_open()
        if isinstance(keep, (str, bytes)) or not isinstance(keep, Iterable):
            raise TypeError(f"keep must be an iterable of topic names (str), not {type(keep).__name__}")
        topics = list(keep)
        for topic in topics:  # (an Enum member would not be found among the queues' names: removed)
            check_str("keep's topic names", topic, "str")
        kept = frozenset(topics)
        # One clean at a time: each one's refusal below would end another's.
        with self._clean_lock:
            # No put to a topic to remove is taken until the writer forgot its queues (review
            # 118 F2); the writer's end then bounds every record of theirs. The refusal lapses
            # by itself once every step below would have timed out (an interrupted clean).
            until = self.supervisor.ticker.now_ms() + self.config.read_your_writes_timeout_ms + round(
                3 * self._reply_timeout_s * 1000)  # fmt: skip
            try:
                written = self._ask("writer", RefusePutsOutside(keep=kept, until_ms=until))
                return self._remove_unused_queues(kept, max(written, self.read_view.acked_end))
            except ServiceUnavailable as exc:
                self.log.warning("clean_unused_topic: the writer did not answer; nothing removed", error=str(exc))
                return 0
            finally:
                try:  # (also after a timed-out first ask: this one lands after it)
                    self._ask("writer", RefusePutsOutside(keep=None))
                except ServiceUnavailable as exc:  # the refusal lapses at `until`
                    self.log.warning("clean_unused_topic: the writer did not answer", error=str(exc))

    def _remove_unused_queues(self, kept: frozenset[str], written: int) -> int:
        """clean_unused_topic's removal, while the writer refuses puts to the topics removed."""
        # The queues first hold every put answered before this call: a removed queue's records
        # dispatched after its removal rebuilt it at their old offsets while the writer, having
        # forgotten it, gave new puts offsets from 0 (review 113 F1: an acknowledged put read
        # OFFSET_TOO_SMALL, or its offset served an old message).
        if self._view_covering(lambda v: v.queues_live and v.queues_written >= written, QUEUES) is None:
            self.log.warning("clean_unused_topic: dispatch did not reach the puts answered before it in time; nothing removed",
                             written=written, queues_written=self.read_view.view.queues_written)  # fmt: skip
            return 0
        try:
            removed: tuple[tuple[str, int], ...] = self._ask("consume_queue", CleanUnusedTopics(keep=kept))
        except ServiceUnavailable as exc:
            self.log.warning("clean_unused_topic: the ConsumeQueue actor did not answer", error=str(exc))
            return 0
        gone = {topic for topic, _ in removed}
        self._encoder.forget_topics(gone)  # their directories are gone
        self.stats_service.forget_topics(gone)
        if removed:
            try:
                self._ask("writer", RemoveQueuesFromTopicQueueTable(queues=removed))
            except ServiceUnavailable as exc:
                # A restarted writer takes its table from the queues, which no longer hold these.
                self.log.warning("clean_unused_topic: the writer did not answer", error=str(exc))
        return len(removed)

    def delete_expired_files_now(self) -> int:
        """executeDeleteFilesManually (§12.5): the next 20 cleaning rounds delete expired
        commitlog files at any hour (at any age above the forced-clean disk ratio); the first
        round runs now. Returns how many commitlog files it deleted (0 if the cleaner is down)."""
        from .messages import CleanRound, DeleteFilesManually

        self._check_open()
        future: StoreFuture[Any] = StoreFuture()  # (waited on here, in the caller's thread)
        if not self.supervisor.ctx.tell("cleaner", DeleteFilesManually(reply=Reply(future=future, store_internal_callback=True))):
            return 0
        try:
            result: CleanRound = future.get(timeout=self._reply_timeout_s)
        except (pykka.Timeout, ServiceUnavailable):
            return 0
        return result.commitlog_deleted

    # arrivals and long polling -------------------------------------------------------------
    def _release_deleted_files(self, _now_ms: int) -> None:
        """Tick hook: every thread's read maps of commitlog segments and index files the
        cleaner deleted are unmapped, so their blocks go back to the disk
        (reads.ReaderRegistry.release_deleted_files)."""
        self._readers.release_deleted_files()

    def _drop_stopped_subscribers(self, _now_ms: int) -> None:
        """Tick hook: subscriptions of actors that stopped without unsubscribing go (review
        84: one whose queues went quiet was kept for good)."""
        self._subscriptions.drop_stopped()

    def _on_arrivals(self, events: Iterable[MessageArrived], dispatched_end: int) -> None:
        """Called in the reput thread after each dispatch batch: cheap, never blocks."""
        self._subscriptions.publish(list(events))

    def subscribe(self, subscriber: Subscriber, topic: str | None = None, queue_id: int | None = None) -> None:
        """Be told `MessageArrived` (an actor ref is told; a callable is called on its own
        listener thread, never a store actor's: one that raises is logged, one that is slow
        delays only its own later events, which coalesce meanwhile into the newest per queue)."""
        self._check_open()
        if not isinstance(subscriber, pykka.ActorRef) and not callable(subscriber):
            raise TypeError(f"subscriber must be an actor ref or a callable, not {type(subscriber).__name__}")
        self._check_not_failed()  # nothing is dispatched again: a silent subscription would wait for good
        if topic is not None:
            check_str("topic", topic, "a str or None")
        if queue_id is not None:
            _check_int("queue_id", queue_id, 0)
        self._subscriptions.add(subscriber, topic, queue_id)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Stop telling `subscriber` (every subscription it has): the object subscribed, a
        bound method of the same object and function, or a ref to the same actor; not an
        object that is only `==` to it (its `__eq__` is never run)."""
        self._check_open()
        self._subscriptions.remove(subscriber)

    def wait_for_messages(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Long polling: block until the queue has a message at `offset` (True) or `timeout_s`
        passes (False). Decided by the read view (so a get after True finds the message), woken
        by the owners' publications, never by polling. Reads the caller's own writes.
        StoreClosedError once the store's supervisor gave up (FAILED), also for a wait under
        way: nothing will arrive, and a long-poll loop would spin on an instant False. A unit
        in a commitlog segment replaced under the store waits its time out (False): a get
        there serves nothing until the store is reopened."""
        self._check_open()
        self._check_not_failed()
        _check_queue(topic, queue_id)
        _check_int("offset", offset, 0)
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool):
            raise TypeError(f"timeout_s must be a number, not {type(timeout_s).__name__}")
        if not timeout_s >= 0:  # NaN too: no wait could end on it
            raise ValueError(f"timeout_s must be >= 0 (inf waits until it arrives or the store closes), not {timeout_s}")
        key = (topic, queue_id)
        own = self._own_put_end()
        deadline = time.monotonic() + timeout_s

        def arrived(view: ReadView) -> bool:
            bounds = view.queue_bounds.get(key)
            return view.queues_live and view.queues_written >= own and bounds is not None and bounds[1] > offset

        view = self.read_view.await_view(arrived, timeout_s, QUEUES)
        if view is not None and not self._unit_in_replaced(view, topic, queue_id, offset):
            return True
        if view is not None:
            # A get there stops until the store is reopened: True would have a long-polling
            # consumer spin on answers that serve nothing (review 146). Its detail says why.
            self.read_view.await_view(lambda _: False, max(deadline - time.monotonic(), 0.0), QUEUES)
        self._check_not_failed()
        return False

    def _unit_in_replaced(self, view: ReadView, topic: str, queue_id: int, offset: int) -> bool:
        """Whether the queue's unit `offset` points into a segment replaced under the store: the
        writer found it, or (before its check) a thread's reader mapped another file there
        (review 148 F3: the wait answered True at once until the writer's tick; review 149 F2:
        so it did on a thread that had not read, where `mqstore.aio` waits and gets on different
        threads). Three compares while none is so."""
        known = self._readers.made()  # (not made here: its maps would outlive a file deleted later)
        seen = self._readers.replaced_seen
        if not view.replaced and not seen and (known is None or not known.commitlog.map_errors):
            return False
        try:
            units = known.queue_reader(view).read_units(topic, queue_id, offset, 1) if known is not None else None
            if units is None:
                units = self._units(topic, queue_id, offset, 1).units
        except (ServiceUnavailable, OSError):
            return False  # (not known there: the get says what it can)
        if not units:
            return False
        phy, _size, _tags = codec.CQ_UNIT.unpack_from(units, 0)
        if in_ranges(view.replaced, phy):
            return True
        segment = phy - phy % self.config.mapped_file_size_commitlog_bytes
        mapped_other = known is not None and isinstance(known.commitlog.map_error(phy), SegmentReplacedError)
        if not mapped_other and segment not in seen:
            return False
        # Still so? (swapped back before the writer's check, a get there maps it again)
        return self._readers.still_another_file(segment, view.segments.get(segment))

    def _check_not_failed(self) -> None:
        if (stopped := self._gave_up_detail()) is not None:
            raise StoreClosedError(stopped)

    def _gave_up_detail(self) -> str | None:
        """Why nothing will be served or published again, once the supervisor gave up (FAILED):
        a read's detail says so rather than naming a wait that did not happen."""
        if self.supervisor.state is not SupervisorState.FAILED:
            return None
        error = self.supervisor.fatal_error
        # An OSError's str names its file (review 123 F4: its repr drops it).
        why = f"{type(error).__name__}: {error}" if isinstance(error, OSError) else repr(error)
        return (f"the store at {self.config.store_path_root_dir} stopped: its supervisor gave up "
                f"({why}); close it and open it again")  # fmt: skip


# Set as the exit hook starts: a store opened after it (in a host's atexit hook that runs
# later, one registered before `import mqstore`) would never be closed (review 93 L2: the next
# open a crash recovery, its put_async callbacks never run). Such an open is refused.
_exit_hook_ran = False


def _refuse_once_exiting() -> None:
    if _exit_hook_ran:
        raise StoreClosedError("the interpreter is exiting and mqstore's exit handler has closed its stores: a "
                               "store opened now would never be closed; open it in an atexit hook registered "
                               "after `import mqstore` (those run before mqstore's), or before the exit")  # fmt: skip


@atexit.register
def _close_forgotten_stores() -> None:
    """A host that forgets close(): stop cleanly if it can, bounded, never hang the exit."""
    global _exit_hook_ran
    _exit_hook_ran = True
    for store in list(_open_stores):
        try:
            store.close()
        except Exception:  # exiting anyway; the abort file makes the next start recover
            pass


def _bodies_bytes(messages: Sequence[Message]) -> int:
    """The bytes of the messages' bodies (0 for a body that is none: its encoding refuses it)."""
    total = 0
    for m in messages:
        try:
            total += memoryview(m.body).nbytes
        except TypeError:
            pass
    return total


def _left_behind_by_fork() -> None:
    """In a child made by fork(), the stores its parent has open: fork copies no thread, so
    none of their actors runs here. Every put waited out its 20 s, every read its own timeout,
    and the child's exit hung ~30 s in a close that stopped nothing (a gunicorn --preload
    worker, a host's os.fork). Closed here at once, touching no file (they are the parent's):
    each call says so."""
    for store in list(_open_stores):
        store._closed_detail = (f"the store at {store.config.store_path_root_dir} was opened by process {store._owner_pid}; "
                                "fork copies none of its threads, so this child cannot use it: open the store after "
                                "forking, in one process at a time")  # fmt: skip
        store._close_finished = True  # close() does nothing here: the files are the parent's
        store._closed = True
        store._puts.left_behind_by_fork(
            f"put in flight when this process was forked from process {store._owner_pid}, which stores it or not: "
            "its outcome is known there only; nothing of it is known in this child")  # fmt: skip
    _open_stores.clear()


os.register_at_fork(after_in_child=_left_behind_by_fork)
