"""The actors' vocabulary: frozen, slotted, keyword-only values. No I/O here.

Public values (`Message`, `PutResult`, `GetResult`, `QueryResult`) are what users put and get.
The actor protocol is stated here, typed, once: a user's own pykka actor tells `store.actor_ref`
(a `StoreRef`) one of the requests `StoreRequest` names (`Put`, `Get`, `Query`, `Subscribe`,
`Unsubscribe`); each of the first three carries a `Reply` typed by its answer, and an actor
replied to is told `Replied`, whose answer is that result or an exception (see `Replied`).
`Subscribe` is answered by `MessageArrived` notices. The rest is what the store's actors say
to each other. Names follow RocketMQ.
"""

from __future__ import annotations

import _thread
import sys
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Generic, Mapping, NamedTuple, Protocol, Sequence, TypeAlias, TypeVar

from ..storage import speedups
from ..storage.codec import DispatchFields, HostAddress, MessageRecord
from ..storage.status import GetMessageStatus, PutMessageStatus

if TYPE_CHECKING:
    from ..storage.recovery import CommitLogRecovery, ConsumeQueueRecovery, IndexRecovery, LogFacts  # noqa: F401

import pykka

__all__ = [
    "Message",
    "plain_message",
    "plain_messages",
    "checked_message",
    "PutResult",
    "GetResult",
    "QueryResult",
    "Reply",
    "host_reply_refusal",
    "Replied",
    "Waiter",
    "Put",
    "Get",
    "Query",
    "Subscribe",
    "Unsubscribe",
    "StoreRequest",
    "StoreRef",
    "MessageArrived",
    "EncodedPut",
    "STORED_STATUSES",
    "ContinueDispatch",
    "GetLogFacts",
    "GetCommitLogRecovery",
    "ResumeQueues",
    "CommitLogAdvanced",
    "GroupCommitRequest",
    "DispatchRequest",
    "DispatchBatch",
    "Tick",
]


# ---------------------------------------------------------------------------------------
# Public values


_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})


class Message(NamedTuple):
    """A message to put. `keys` are indexed for `query`; `tags` are filterable on `get`.

    Immutable; a NamedTuple because producers build one per message: 0.46 us against 1.32 us
    for the frozen dataclass it was (a third of the store's own cost per message in put_batch)."""

    topic: str
    body: bytes | bytearray | memoryview  # stored as its bytes (as the put took them)
    queue_id: int = 0
    tags: str | None = None
    keys: Sequence[str] | str = ()
    properties: Mapping[str, str] = _NO_PROPERTIES
    flag: int = 0
    born_host: str | None = None
    born_timestamp_ms: int | None = None
    wait_store_msg_ok: bool = True  # RocketMQ's WAIT property: under sync flush, wait for the disk


_MESSAGE_FIELDS = Message._fields


def plain_message(message: Message) -> Message:
    """`message` as a plain Message, each field read once: a subclass may compute a field
    (a property that picks a random queue), and the store reads a message's topic and queue
    more than once (to check it, to encode it, to count its queue offset). Read twice, such a
    field put a record in one queue with an offset of another's counter, and the next
    message of that queue was given the same offset (review 44 H2)."""
    if type(message) is Message:
        return message
    return Message(*[getattr(message, name) for name in _MESSAGE_FIELDS])


def checked_message(message: Message) -> Message:
    """`message` as a plain Message (`plain_message`); TypeError if it is not a Message."""
    if type(message) is not Message:
        if not isinstance(message, Message):
            raise TypeError(f"message must be a mqstore.Message, not {type(message).__name__}")
        message = plain_message(message)
    return message


def plain_messages(messages: Sequence[Message]) -> tuple[Message, ...]:
    """`plain_message` of each, as a tuple (the messages themselves when all are plain)."""
    for message in messages:
        if type(message) is not Message:
            return tuple(plain_message(m) for m in messages)
    return tuple(messages)


# The statuses whose message is in the log: `PutResult.stored`, and its hot paths' set test.
STORED_STATUSES: frozenset[PutMessageStatus] = frozenset((PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT))


class PutResult(NamedTuple):
    """The answer to a put. `ok` means PUT_OK; `stored` means the bytes are in the log
    (PUT_OK, or FLUSH_DISK_TIMEOUT where RocketMQ also keeps the message). Immutable; a
    NamedTuple, like `Message`, because one is built per put (0.4 us against 1.2 us)."""

    status: PutMessageStatus
    commitlog_offset: int = -1
    wrote_bytes: int = 0
    queue_offset: int = -1
    msg_ids: tuple[str, ...] = ()
    store_timestamp: int = 0
    msg_num: int = 0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK

    @property
    def stored(self) -> bool:
        return self.status in STORED_STATUSES

    @property
    def msg_id(self) -> str:
        return ",".join(self.msg_ids)

    def __bool__(self) -> bool:
        """Refused: as a tuple a PutResult would always be true, so `if store.put(m):` counted
        a refused put as stored without a word from mypy or the runtime (review 73 M5)."""
        raise TypeError(f"a PutResult has no truth value ({self.status.name}): test .ok (PUT_OK) or .stored "
                        "(in the log: PUT_OK or FLUSH_DISK_TIMEOUT)")  # fmt: skip

    def with_status(self, status: PutMessageStatus, detail: str = "") -> PutResult:
        return PutResult(
            status=status,
            commitlog_offset=self.commitlog_offset,
            wrote_bytes=self.wrote_bytes,
            queue_offset=self.queue_offset,
            msg_ids=self.msg_ids,
            store_timestamp=self.store_timestamp,
            msg_num=self.msg_num,
            detail=detail or self.detail,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GetResult:
    status: GetMessageStatus
    messages: tuple[MessageRecord, ...] = ()
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    raw: tuple[bytes, ...] = ()
    detail: str = ""  # why nothing or less was read: the queue unreadable (NO_MATCHED_LOGIC_QUEUE), a corrupt record skipped

    @property
    def found(self) -> bool:
        return self.status is GetMessageStatus.FOUND


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryResult:
    messages: tuple[MessageRecord, ...] = ()
    index_last_update_timestamp: int = 0
    index_last_update_phy_offset: int = 0
    # Set when the answer is not complete: the index or a record could not be read, or a hit was
    # skipped as damaged (its CRC, recovery's quarantine, or keys changed after it was indexed).
    detail: str = ""

    @classmethod
    def of(cls, messages: tuple[MessageRecord, ...], last_update_timestamp: int, last_update_phy_offset: int) -> QueryResult:
        """A complete answer (no detail), built without the generated __init__'s keyword
        handling: half its cost, on a key lookup's path."""
        result = _new_object(cls)
        _set_attribute(result, "messages", messages)
        _set_attribute(result, "index_last_update_timestamp", last_update_timestamp)
        _set_attribute(result, "index_last_update_phy_offset", last_update_phy_offset)
        _set_attribute(result, "detail", "")
        return result


_new_object = object.__new__
_set_attribute = object.__setattr__  # (a frozen dataclass's own __init__ sets its fields so)


# ---------------------------------------------------------------------------------------
# Replies: a future, or an actor address with a correlation id


class Waiter:
    """A one-shot answer slot for a thread that blocks on it, in the role of a pykka future
    (`set`, `set_exception`, `get`). A raw lock rather than pykka's Condition-based future:
    one futex wake per answer; a 4-client echo through an actor measured 28k round trips/s
    with pykka futures and queues, 50-64k with this and the store's FastInbox."""

    __slots__ = ("_signal", "_answered", "_taken", "_value", "_error")

    def __init__(self) -> None:
        native = speedups.native
        # A C semaphore (a raw lock without the extension). Its post keeps the GIL here,
        # unlike the inboxes' (runtime.FastInbox): answers often go out in bursts (a
        # group commit answers up to one per producer), and a GIL hand-off per answer made
        # 16 SYNC_FLUSH producers 13% slower; single answers measured the same either way.
        self._signal: Any = native.Signal() if native is not None else _LockSignal()
        self._answered = False
        self._taken = False
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any = None) -> None:
        if self._answered:
            return  # answered twice: the first answer stands (Reply also guards this)
        self._answered = True
        self._value = value
        self._signal.post_holding_gil()

    def hand_over(self, value: Any) -> None:
        """`set`, dropping the GIL while the caller is woken, so it can run at once instead
        of waking only to wait for the GIL. For an answerer with one answer to give (the
        writer: 4 put threads +10%, on one CPU or two); a burst of answers (group commit)
        keeps `set` (16 SYNC_FLUSH producers measured 14% slower with this)."""
        if self._answered:
            return
        self._answered = True
        self._value = value
        self._signal.post()

    def set_later(self, value: Any, posts: list[Any]) -> None:
        """`set`, the post left to the caller: the signal goes into `posts`, which the answerer
        posts with the pass's other answers in one call without the GIL (`_native.post_all`)."""
        if self._answered:
            return
        self._answered = True
        self._value = value
        if isinstance(self._signal, _LockSignal):
            self._signal.post_holding_gil()
        else:
            posts.append(self._signal)

    def set_exception(self, exc_info: Any = None) -> None:
        if self._answered:
            return
        self._answered = True
        error = (exc_info or sys.exc_info())[1]
        self._error = error if error is not None else RuntimeError("failed without an exception")
        self._signal.post_holding_gil()

    def get(self, timeout: float | None = None) -> Any:
        """The answer, once it came (a second get() returns it again). One getter thread.
        (Re-posting the signal for later getters instead cost a GIL hand-off per put:
        a 1-client echo went from 17 to 80 us a round trip.)"""
        if not self._taken:
            if not self._signal.wait(-1.0 if timeout is None else max(timeout, 0.0)):
                raise pykka.Timeout(f"{timeout} seconds")
            self._taken = True
        if self._error is not None:
            raise self._error
        return self._value


class _LockSignal:
    """`_native.Signal` for a one-shot waiter, from a raw lock."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()

    def post(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:
            pass

    post_holding_gil = post

    def wait(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=timeout)


def _answer_dropped(target: str, answer: Any, why: BaseException) -> None:
    """Logged in full once per target and error type, then once a minute with a count: a host
    asking again and again for an actor that stopped logged 1.8k lines/s (review 58 F4)."""
    from .. import log

    suppressed = log.PROCESS_REPEATS.admit(("answer dropped", target, type(why)))  # no store's: a Reply is anyone's
    if suppressed is not None:
        log.get_logger(__name__).warning("an answer could not be delivered; dropped", target=target,
                                         answer=type(answer).__name__, error=log.error_repr(why),
                                         **log.suppressed_fields(suppressed))  # fmt: skip


def _call_soon(callback: Callable[[Any], object], answer: Any) -> None:
    """Host code never runs on the answering store actor's thread: the notifier calls it."""
    from ..runtime import call_soon  # runtime imports this package's siblings: import late

    call_soon(callback, answer)


# How long the notifier waits for a host's pykka future's lock, and how long after it looks
# again, and for how long at most: one a host thread holds for good (a Ctrl-C inside its
# get()) must not hold every other host's answer behind it on the one notifier thread.
_HOSTS_LOCK_WAIT_S = 0.05
_HOSTS_LOCK_RETRY_S = 1.0
_HOSTS_LOCK_GIVE_UP_S = 600.0


def _complete_hosts_future(completion: tuple[pykka.Future[Any], Any, bool], waited_s: float = 0.0) -> None:
    """(On the notifier.) A host's pykka future given its answer, or its exception. A plain
    ThreadingFuture whose lock is held is looked at again later rather than waited for."""
    future, answer, failed = completion
    if type(future) is pykka.ThreadingFuture:
        condition = future._condition  # (an RLock's: its set() takes it again)
        if not condition.acquire(timeout=_HOSTS_LOCK_WAIT_S):
            if waited_s >= _HOSTS_LOCK_GIVE_UP_S:
                _answer_dropped("future", answer, TimeoutError(f"its lock was held for {waited_s:.0f} s"))
                return
            retry = threading.Timer(_HOSTS_LOCK_RETRY_S, _call_soon,
                                    (lambda c: _complete_hosts_future(c, waited_s + _HOSTS_LOCK_RETRY_S), completion))  # fmt: skip
            retry.daemon = True
            retry.start()
            return
        try:
            _set_hosts_future(future, answer, failed)
        finally:
            condition.release()
        return
    _set_hosts_future(future, answer, failed)


def _set_hosts_future(future: pykka.Future[Any], answer: Any, failed: bool) -> None:
    try:
        if failed:
            future.set_exception((type(answer), answer, answer.__traceback__))
        else:
            future.set(answer)
    except Exception as exc:  # a caller's future set already: theirs to see, not the store's
        _answer_dropped("future", answer, exc)


A_contra = TypeVar("A_contra", contravariant=True)


class Reply(Generic[A_contra]):
    """Where an answer goes: a pykka future, an actor (told `(correlation_id, answer)` as a
    `Replied` message), or a plain callback, which the notifier calls on its own thread (a
    slow or raising callback never stalls or crashes the store actor that answered).
    Completing twice is ignored, so a crash path and a normal path can both try without harm.

    Typed by its answer: a request's `reply` field says which (`Put.reply: Reply[PutResult]`),
    so a future of the wrong type given to a request fails mypy (review 73 M1). An answer may
    instead be an exception (a malformed request, an actor that stopped first): a future
    raises it, an actor is told it as `Replied.answer`, a callback is called with it."""

    __slots__ = ("_future", "_actor", "_callback", "_inline", "_correlation_id", "_done", "_lock")

    def __init__(
        self,
        *,
        future: pykka.Future[A_contra] | Waiter | None = None,
        actor: pykka.ActorRef[Any] | None = None,
        callback: Callable[[A_contra | Exception], object] | None = None,
        correlation_id: object = None,
        store_internal_callback: bool = False,
    ) -> None:
        """`store_internal_callback`: the callback, or the pykka future, is the store's own,
        cheap and not raising (stats bookkeeping, a future a store actor waits on), so it is
        completed on the answering thread; never for host code. A host's pykka future is
        completed on the notifier, as a callback is run: its set() takes the future's lock,
        which a host thread may hold (a Ctrl-C inside its get() leaves it held), and a
        subclass's set() is host code (review 115 F2/F3: either froze the writer, every put
        of the store with it, or a gateway reader). A Waiter is the store's own.
        TypeError here, in the sender's thread, for a target of another type: found when the
        store answers, it could only be logged."""
        if future is not None and not isinstance(future, (pykka.Future, Waiter)):
            raise TypeError(f"Reply.future must be a pykka Future or a Waiter, not {type(future).__name__}")
        if actor is not None and not isinstance(actor, pykka.ActorRef):
            raise TypeError(f"Reply.actor must be a pykka ActorRef, not {type(actor).__name__}")
        if callback is not None and not callable(callback):
            raise TypeError(f"Reply.callback must be callable, not {type(callback).__name__}")
        self._future = future
        self._actor = actor
        self._callback = callback
        self._inline = store_internal_callback
        self._correlation_id = correlation_id
        self._done = False
        self._lock = threading.Lock()

    @property
    def answered(self) -> bool:
        """Sent or failed already (read without the lock: it only ever turns True)."""
        return self._done

    def send(self, answer: A_contra, *, hand_over: bool = False, posts: list[Any] | None = None) -> None:
        """Deliver `answer`. `hand_over`: the sender has nothing more to answer right now,
        so a waiting thread may take the GIL at once (`Waiter.hand_over`). `posts`: a
        waiting thread's wake-up goes there instead, for the sender to post with others
        (`Waiter.set_later`)."""
        with self._lock:
            if self._done:
                return
            self._done = True
        future = self._future
        if future is not None:
            try:
                if isinstance(future, Waiter):
                    if posts is not None:
                        future.set_later(answer, posts)
                    elif hand_over:
                        future.hand_over(answer)
                    else:
                        future.set(answer)
                elif self._inline:
                    future.set(answer)
                else:
                    _call_soon(_complete_hosts_future, (future, answer, False))
            except Exception as exc:  # a caller's future set already: theirs to see, not the store's
                _answer_dropped("future", answer, exc)
        if self._actor is not None:
            self._tell(answer)
        if self._callback is not None:
            self._run_callback(answer)

    def fail(self, exc: BaseException) -> None:
        """Answer with `exc`; one that is no Exception (SystemExit, KeyboardInterrupt from the
        host's code the store ran) is answered as a RuntimeError naming it: raised again where
        the answer is read, it would end that thread or the host's program."""
        if not isinstance(exc, Exception):
            exc = RuntimeError(f"the request raised {exc!r}")
        with self._lock:
            if self._done:
                return
            self._done = True
        future = self._future
        if future is not None:
            if isinstance(future, Waiter) or self._inline:
                try:
                    future.set_exception((type(exc), exc, exc.__traceback__))
                except Exception as error:
                    _answer_dropped("future", exc, error)
            else:
                _call_soon(_complete_hosts_future, (future, exc, True))
        if self._actor is not None:
            self._tell(exc)
        if self._callback is not None:
            self._run_callback(exc)

    def _tell(self, answer: Any) -> None:
        """An asker that stopped before its answer came, or a ref of the host's whose tell
        raises, is no fault of the store actor that answers it (that actor would crash, and
        enough of them would stop the store: review 27 saw a gateway reader, the gateway and
        reput brought down this way)."""
        assert self._actor is not None
        from ..runtime import tell_from_store  # runtime imports this package's siblings: import late

        try:
            tell_from_store(self._actor, Replied(correlation_id=self._correlation_id, answer=answer))
        except Exception as exc:
            _answer_dropped("actor", answer, exc)

    def _run_callback(self, answer: Any) -> None:
        callback = self._callback
        if callback is None:
            return
        if self._inline:
            callback(answer)
        else:
            _call_soon(callback, answer)

    @property
    def done(self) -> bool:
        return self._done

    @property
    def actor(self) -> pykka.ActorRef[Any] | None:
        """The actor this answer is told to (None: a future or a callback)."""
        return self._actor


def host_reply_refusal(reply: object) -> str | None:
    """Why a `Reply` a host handed the store (a request's, `submit_put`'s) may not be answered
    by a store thread, or None. A subclass's send() and fail() are the host's code, and a
    `store_internal_callback` runs its callback inline: on the writer's thread, one that
    blocked held up every put and the close for good (review 131 F2)."""
    if type(reply) is not Reply:
        return f"its reply is a {type(reply).__name__}, not a Reply itself (a subclass's methods would run on a store thread)"
    if reply._inline:
        return "its reply has store_internal_callback=True, which is for the store's own callbacks (it would run on a store thread)"
    future = reply._future
    if isinstance(future, Waiter) and type(future) is not Waiter:
        # A Waiter is set on the answering thread (it is the store's own); a subclass's set()
        # is the host's code (review 132 F2: on the writer's, every put waited for it).
        return f"its future is a {type(future).__name__}, not a Waiter itself (its methods would run on a store thread)"
    return None


R_co = TypeVar("R_co", covariant=True)


class AskFor(Generic[R_co]):
    """Base of a request that is answered: `R_co` is its one reply type, so a typed ask
    (`runtime.ask`, `Supervisor._ask`) returns it, and a handler that answers something else
    fails mypy. Told-only messages (notices, and requests carrying their own `Reply`) are not."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Asked:
    """A request told together with where its answer goes: a store actor sends `reply` what
    its handler returns for `message` (or fails it if the handler raises or the actor stops
    first). The store's own reads ask this way with a `Waiter`: one semaphore each way,
    where pykka's ask builds a Condition-based future (a round trip to an echo actor:
    30-65 us against 80 us)."""

    message: Any
    reply: Reply[Any]


A_co = TypeVar("A_co", covariant=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Replied(Generic[A_co]):
    """What an actor that sent a request with `Reply(actor=..., correlation_id=...)` is told
    back: the answer (`PutResult`, `GetResult` or `QueryResult`, as the request's `reply`
    field says) or the exception that answered instead. An actor's `on_receive` gets it
    untyped; class patterns narrow it for mypy, and the exception case is part of the match:
    `case Replied(answer=PutResult() as result)`, `case Replied(answer=Exception() as error)`
    (examples/actor_client.py). `correlation_id` is the asker's own value, given back as is.

    The exceptions an answer can be: TypeError or ValueError (a malformed request, naming the
    field), StoreClosedError (the store closed or its supervisor gave up), pykka.ActorDeadError
    (the gateway's readers are being restarted: ask again), and, for a store actor that failed
    or stopped before answering, `ServiceUnavailable` and `StoppedBeforeHandling` (both
    RuntimeError: asking again once the actor is restarted may succeed). A put refused for an
    operating reason (a full disk, a restart) is a PutResult with its status, not an exception."""

    correlation_id: Any
    answer: A_co | Exception


# ---------------------------------------------------------------------------------------
# Requests a user's actor sends to the store's gateway


@dataclass(frozen=True, slots=True, kw_only=True)
class Put:
    messages: Sequence[Message]  # a tuple or a list (read once, when the gateway takes the Put)
    reply: Reply[PutResult]
    batch: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Get:
    topic: str
    queue_id: int
    offset: int
    max_count: int
    reply: Reply[GetResult]
    tags: str | None = None
    max_total_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Query:
    topic: str
    key: str
    max_count: int
    reply: Reply[QueryResult]
    begin_ms: int = 0
    end_ms: int = 2**63 - 1


Subscriber: TypeAlias = "pykka.ActorRef[Any] | Callable[[MessageArrived], object]"


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribe:
    """Be told `MessageArrived` after dispatches into this queue (None: every queue). An actor
    with pykka's own unbounded inbox is told every dispatch batch's notice; a callable (called
    on its own listener thread, never a store actor's) or an actor with a bounded inbox has the
    notices that come while it is busy coalesced, the newest per queue (`max_offset` is
    absolute), so a slow subscriber holds at most one pending notice per queue."""

    subscriber: Subscriber
    topic: str | None = None
    queue_id: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Unsubscribe:
    subscriber: Subscriber


# What `store.actor_ref` takes (the actor protocol's requests).
StoreRequest: TypeAlias = Put | Get | Query | Subscribe | Unsubscribe


class StoreRef(Protocol):
    """`store.actor_ref` as a type checker sees it: a pykka ref (it follows the supervised
    gateway across restarts) whose `tell` takes the protocol's requests only, so telling it
    anything else fails mypy (at run time it is logged and dropped, as nothing can answer it)."""

    def tell(self, message: StoreRequest) -> None: ...

    def is_alive(self) -> bool: ...

    @property
    def actor_urn(self) -> str: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageArrived:
    """RocketMQ's arriving hook: `max_offset` is one past the newest queue offset dispatched."""

    topic: str
    queue_id: int
    max_offset: int
    store_timestamp: int


# ---------------------------------------------------------------------------------------
# Between the store's own actors


class EncodedPut(NamedTuple):
    """Records encoded in the caller's thread; the writer fills in offsets and the timestamp.
    A NamedTuple: one is built per put (0.4 us against 1.2 us for the frozen dataclass)."""

    records: tuple[bytes, ...]
    topic: str
    queue_id: int
    sys_flag: int
    batch: bool
    sync_wait: bool
    reply: Reply[PutResult]
    enqueued_ns: int


class CommitLogAdvanced(NamedTuple):
    """Absolute positions, so a lost or repeated notice costs nothing (STYLE habit 4)."""

    max_offset: int  # readable end (wrote, or committed with the transient store pool)
    wrote_offset: int
    store_timestamp: int  # of the newest record at or below max_offset


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupCommitRequest:
    next_offset: int
    result: PutResult
    reply: Reply[PutResult]
    deadline_ns: int
    appended_ns: int  # monotonic time the writer finished appending these bytes


# One per record on the dispatch hot path, so an immutable NamedTuple (the codec builds it
# directly) rather than a frozen dataclass, which costs several times more to construct.
DispatchRequest = DispatchFields


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchBatch:
    requests: tuple[DispatchRequest, ...]
    end_offset: int  # commitlog offset just past the last record read for this batch


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    now_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ContinueDispatch:
    """The reput actor to itself: dispatch on from where its last pass stopped (a long
    catch-up goes in bounded passes, so the actor answers its inbox between them)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(AskFor["Pong"]):
    """The start handshake: every actor answers `Pong` once it started (status queries have
    their own messages)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pong:
    """The answer to `Ping`: the actor is up."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterReady:
    max_offset: int
    wrote_offset: int
    min_offset: int
    store_timestamp: int
    topic_queue_table: dict[str, int]
    degraded: bool = False  # a missing or wrong-sized segment: puts refused until `mqstore recover`


@dataclass(frozen=True, slots=True, kw_only=True)
class GetLogFacts(AskFor["LogFacts"]):
    """To the writer: what the other owners' recovery needs of the commitlog (its bounds now,
    and where its recovery's crash scan started)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetCommitLogRecovery(AskFor["CommitLogRecovery"]):
    """To the writer: what its recovery in on_start found (for the open's report)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeQueues(AskFor["WriterReady"]):
    """To a writer that recovered its log: the second step of its start, once the ConsumeQueue
    owner recovered. `topic_queue_table` holds the queues' next offsets from their units, for
    the records below `dispatch_from`; the writer counts the rest from its log. Puts are
    refused until this arrives."""

    topic_queue_table: dict[str, int]
    dispatch_from: int
    # Queues clean_unused_topic removed, with the commitlog offset below which their records
    # are the removed queue's: only those at or past it count for the queue's next offset.
    cleaned: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SetWriteable(AskFor["WriterReady"]):
    """RunningFlags, as the writer sees them: refuse puts while not writeable or closing."""

    writeable: bool
    closing: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocateRequest:
    """Ask for the segment needed now (`next_path`) and pre-create the one after it (None: the
    one after it would be named past the largest offset, and is never made)."""

    next_path: str
    next_next_path: str | None
    file_size: int
    reply: Reply[Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitWriteBuffers:
    least_pages: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FlushAll:
    """Flush everything now (store.flush(), shutdown) and answer when it is on disk.
    `up_to`: the log end the asker learnt from the writer (notices may lag behind it)."""

    reply: Reply[Any]
    up_to: int = 0
    store_timestamp: int = 0  # of the record ending at `up_to`, for the checkpoint


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumeQueueFlushed:
    logics_msg_timestamp: int
    thorough: bool
    # Every unit of a record below it was forced by this flush (0: not known).
    logics_flushed_offset: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexFileFlushed:
    index_msg_timestamp: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GetUnits(AskFor["UnitsReply"]):
    """Ask the ConsumeQueue actor for units from `offset` (at most `max_units`, one file)."""

    topic: str
    queue_id: int
    offset: int
    max_units: int


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitsReply:
    exists: bool
    min_offset: int
    max_offset: int
    units: bytes | None  # None: the file holding `offset` is gone (OFFSET_FOUND_NULL)
    next_file_offset: int
    commitlog_head: int  # how far dispatch has read the log: "in memory" is measured from here
    # Why the file holding `offset` could not be read now (out of descriptors or maps), "" if it
    # could: the units are there, so the read must keep its offset, not skip the file.
    unreadable: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueBounds:
    """What the ConsumeQueue actor publishes for readers of consumequeue/ (`get` reads the
    units through its own maps): per (topic, queueId), the first and the next readable queue
    offset, every unit below the latter written; and the commitlog offset up to which every
    dispatched unit is written. `complete`: the whole table (after the actor's start), else
    only the queues that changed."""

    bounds: Mapping[tuple[str, int], tuple[int, int]]
    dispatched_offset: int
    complete: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueSnapshot:
    """The ConsumeQueue actor's facts: max offset per "topic-queueId", and where dispatch may resume."""

    topic_queue_table: dict[str, int]
    resume_offset: int
    logics_msg_timestamp: int
    waiting_batches: int = 0  # dispatched to it, not yet written (a full disk)
    recovered: ConsumeQueueRecovery | None = None  # what its recovery in on_start found
    # "topic-queueId" -> next queue offset, where the queue's units stop short of offsets
    # handed out to records that were lost (recovery's `reserved` less what re-dispatch gave back).
    lost_queue_offsets: dict[str, int] = field(default_factory=dict)
    # Queues clean_unused_topic removed (this run or an earlier one, through the queue ledger),
    # with the commitlog offset below which their records are the removed queue's.
    cleaned: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryOffsets(AskFor["QueryOffsetsReply"]):
    topic: str
    key: str
    max_num: int
    begin_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryOffsetsReply:
    offsets: tuple[int, ...]
    last_update_timestamp: int
    last_update_phy_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexSnapshot:
    resume_offset: int
    waiting_batches: int = 0  # dispatched to it, not yet written (a full disk)
    recovered: IndexRecovery | None = None  # what its recovery in on_start found


@dataclass(frozen=True, slots=True, kw_only=True)
class GetWriterStatus(AskFor["WriterReady"]):
    """Status query to the writer: where the log ends, its min offset, its queue table."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetQueueSnapshot(AskFor["QueueSnapshot"]):
    """Status query to the ConsumeQueue actor."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetIndexSnapshot(AskFor["IndexSnapshot"]):
    """Status query to the index actor."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetReputStatus(AskFor["ReputStatus"]):
    """Status query to reput: how far dispatch has read, and the end it knows of."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AwaitDispatched:
    """To reput: answer `reply` (with ReputStatus) once dispatch has passed `up_to`, the
    readable end the asker learnt from the writer (shutdown waits on this, never polls)."""

    up_to: int
    reply: Reply[Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReputStatus:
    reput_offset: int
    max_offset: int
    # Dispatch waits at a commitlog hole (a segment missing or cut short) at `reput_offset`:
    # what lies past it is not dispatched until `mqstore recover` or the segment is back.
    at_hole: bool = False


__all__ += [
    "Asked",
    "Replied",
    "HostAddress",
    "Ping",
    "Pong",
    "Subscriber",
    "WriterReady",
    "SetWriteable",
    "AllocateRequest",
    "CommitWriteBuffers",
    "FlushAll",
    "ConsumeQueueFlushed",
    "IndexFileFlushed",
    "GetUnits",
    "UnitsReply",
    "QueueBounds",
    "QueueSnapshot",
    "QueryOffsets",
    "QueryOffsetsReply",
    "IndexSnapshot",
    "ReputStatus",
    "AwaitDispatched",
    "AskFor",
    "GetWriterStatus",
    "GetQueueSnapshot",
    "GetIndexSnapshot",
    "GetReputStatus",
]


# ---------------------------------------------------------------------------------------
# Read side: offset by time


@dataclass(frozen=True, slots=True, kw_only=True)
class GetOffsetByTime(AskFor[int]):
    """Ask the ConsumeQueue actor for getOffsetInQueueByTime (§9.5). The answer is a queue
    offset: the message stored at `timestamp_ms`, else its nearest neighbour; 0 if nothing."""

    topic: str
    queue_id: int
    timestamp_ms: int


__all__ += ["GetOffsetByTime"]


# ---------------------------------------------------------------------------------------
# Put side: a topic new to the store gets its directory before its first put is taken


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicDirectoryRefused:
    """Why a topic cannot have consumequeue/<topic>/ of its own. `illegal`: the filesystem
    cannot give it one under this name, whatever is done (its name taken by another topic's
    directory on a filesystem that does not tell case apart, or a character the filesystem
    refuses); otherwise the directory could not be made now (permissions, a full disk)."""

    illegal: bool
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimTopicDirectory(AskFor["TopicDirectoryRefused | None"]):
    """To the ConsumeQueue actor, before a put of a topic new to the store is taken: make the
    topic's directory and check it is its own (answered None), so the filesystem's name rules
    refuse the put instead of holding dispatch after the put was acknowledged."""

    topic: str


__all__ += ["ClaimTopicDirectory", "TopicDirectoryRefused"]


# ---------------------------------------------------------------------------------------
# cleanUnusedTopic: each structure's owner removes its part


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanUnusedTopics(AskFor["tuple[tuple[str, int], ...]"]):
    """To the ConsumeQueue actor (DefaultMessageStore.cleanUnusedTopic): destroy every queue
    (files and table entry) of each topic not in `keep`, except the schedule topic; answered
    with the (topic, queue_id) of the queues removed."""

    keep: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoveQueuesFromTopicQueueTable(AskFor[int]):
    """To the writer (CommitLog.removeQueueFromTopicQueueTable): forget the next queue offset
    of these queues, so a later put to one starts its new queue at 0; answered with how many
    it knew."""

    queues: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RefusePutsOutside(AskFor[int]):
    """To the writer, from clean_unused_topic before it removes anything: refuse puts to every
    topic outside `keep` but SCHEDULE_TOPIC_XXXX (SERVICE_NOT_AVAILABLE, nothing stored) until
    told again with `keep=None`, or until `until_ms` of the store's ticker has passed (a clean
    whose thread was interrupted); answered with the log's readable end. The queues to remove
    then hold every record of theirs, and no put takes one of their old queue offsets between
    their removal and the writer forgetting them (review 118 F2: such a put rebuilt the queue
    at its offset, and every put after the clean, given offsets from 0, read OFFSET_TOO_SMALL).
    Kept in the actors' context: a restarted writer refuses the same (review 122 F1)."""

    keep: frozenset[str] | None
    until_ms: int = 0


__all__ += ["CleanUnusedTopics", "RemoveQueuesFromTopicQueueTable", "RefusePutsOutside"]


# ---------------------------------------------------------------------------------------
# Cleaning (§12): the cleaner decides, each file's owner deletes


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteExpiredCommitLogFiles:
    """To the writer (§12.4): delete at most `max_files` of the oldest segments that are older
    than `expired_ms` (any age if `clean_immediately`), the newest always kept. The cleaner
    spaces successive requests, so the writer never sleeps. Answered with CommitLogFilesDeleted."""

    expired_ms: int
    forcibly_ms: int
    clean_immediately: bool
    now_ms: int
    max_files: int
    reply: Reply[Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class RedeleteHangedCommitLogFile:
    """To the writer (§12.5): destroy again a first segment that was shut down but still held."""

    forcibly_ms: int
    now_ms: int
    reply: Reply[Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitLogFilesDeleted:
    deleted: int
    min_offset: int  # the commitlog's min offset after the deletion (-1: no file)
    file_count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteExpiredConsumeQueueFiles:
    """To the ConsumeQueue actor (§12.6): walk the queues in (topic, queue_id) order after
    `start_after`, delete files whose units all point below `min_phy_offset` and correct each
    queue's min offset; stop after the first queue that deleted files (the cleaner pauses)."""

    min_phy_offset: int
    start_after: tuple[str, int] | None
    reply: Reply[Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumeQueueFilesDeleted:
    deleted: int
    last_queue: tuple[str, int] | None  # where to resume; None when every queue was visited


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteExpiredIndexFiles:
    """To the index actor (§10.8): delete index files whose entries all point below the offset."""

    min_phy_offset: int
    reply: Reply[Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteFilesManually:
    """executeDeleteFilesManually (§12.5): the next 20 rounds delete at any hour; one runs now."""

    reply: Reply[Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanRound:
    """What one cleaning round decided and did (the cleaner's answer to Tick and to DeleteFilesManually)."""

    ran: bool  # False before the first delay passed
    timeup: bool = False
    spacefull: bool = False
    manual: bool = False
    clean_immediately: bool = False
    disk_full: bool = False
    commitlog_deleted: int = 0
    hanged_deleted: int = 0
    consume_queue_deleted: int = 0
    index_deleted: int = 0
    min_offset: int = -1


__all__ += [
    "DeleteExpiredCommitLogFiles",
    "RedeleteHangedCommitLogFile",
    "CommitLogFilesDeleted",
    "DeleteExpiredConsumeQueueFiles",
    "ConsumeQueueFilesDeleted",
    "DeleteExpiredIndexFiles",
    "DeleteFilesManually",
    "CleanRound",
]
