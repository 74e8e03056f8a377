"""The store's face for other pykka actors (`store.actor_ref`), supervised like any actor.

The gateway only routes: a put is checked and encoded here and told to the writer (one
thread, so one sender's puts keep their order); gets and queries go to a small pool of
reader actors, so an actor client's read never queues behind puts on one thread, nor a put
behind a read. A malformed request is answered with a TypeError or ValueError naming the
field, through its own `Reply`, and the gateway carries on: it crashes only on its own bug,
and the supervisor then restarts it (the host's `store.actor_ref` follows the new one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, ContextManager, Protocol, assert_never

import pykka

from ..errors import StoreClosedError
from ..log import RepeatedLog, suppressed_fields
from ..storage.codec import JAVA_LONG_MAX
from ..messages import (
    Get,
    GetResult,
    Message,
    Ping,
    Pong,
    Put,
    PutResult,
    Query,
    QueryResult,
    Reply,
    Subscribe,
    Subscriber,
    Unsubscribe,
    Waiter,
    host_reply_refusal,
)
from .base import ActorContext, RequestT, StoreActor

__all__ = ["StoreBackend", "StoreGateway", "GatewayReader", "GatewayRequest", "GATEWAY_READERS", "request_error"]

# Readers of the pool: two keep one client's long scan from holding up another's get, and
# more only add threads contending for the GIL on a 2-CPU machine.
GATEWAY_READERS = 2

GatewayRequest = Put | Get | Query | Subscribe | Unsubscribe | Ping
ReaderRequest = Get | Query | Ping


class StoreBackend(Protocol):
    """What the gateway needs of the store (the embedded API it puts, reads and subscribes through)."""

    def submit_put(self, messages: Sequence[Message], *, batch: bool, reply: Reply[PutResult] | None = None) -> Waiter | PutResult: ...

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        max_total_bytes: int | None = None,
        tags: str | None = None,
    ) -> GetResult: ...

    def query(self, topic: str, key: str, max_count: int | None = None, begin_ms: int = 0, end_ms: int = 2**63 - 1) -> QueryResult: ...

    def subscribe(self, subscriber: Subscriber, topic: str | None = None, queue_id: int | None = None) -> None: ...

    def unsubscribe(self, subscriber: Subscriber) -> None: ...

    def reading_for(self, actor: pykka.ActorRef[Any] | None) -> ContextManager[None]: ...


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_error(field: str, expected: str, value: object) -> TypeError:
    # Text fields are exact strs (codec.check_str): an Enum member keys and prints otherwise.
    # Only a subclass gets the hint: for a plain str where no text belongs it misled (review 103 L7).
    hint = " (a str subclass such as an Enum member: pass its .value)" if isinstance(value, str) and type(value) is not str else ""
    return TypeError(f"{field} must be {expected}, not {type(value).__name__}{hint}")


def request_error(request: GatewayRequest) -> Exception | None:
    """What is wrong with a request's fields (a TypeError or ValueError naming the field), or
    None. The dataclasses do not check types at run time, so a client can send anything."""
    match request:
        case Put(messages=messages, batch=batch):
            if isinstance(messages, Message):  # a NamedTuple: its topic was named as messages[0] (review 103 L7)
                return TypeError("Put.messages takes a tuple or list of Message, not a single Message: wrap it in one")
            if not isinstance(messages, (tuple, list)):
                return _type_error("Put.messages", "a tuple or list of Message", messages)
            if not messages:
                return ValueError("Put.messages is empty: nothing to put")
            for i, message in enumerate(messages):
                if not isinstance(message, Message):
                    return _type_error(f"Put.messages[{i}]", "a Message", message)
                if type(message.topic) is not str:
                    return _type_error(f"Put.messages[{i}].topic", "a str", message.topic)
                if not isinstance(message.body, (bytes, bytearray, memoryview)):  # as `put` takes them
                    return _type_error(f"Put.messages[{i}].body", "bytes, bytearray or memoryview", message.body)
                if not _is_int(message.queue_id):
                    return _type_error(f"Put.messages[{i}].queue_id", "an int", message.queue_id)
            if not isinstance(batch, bool):
                return _type_error("Put.batch", "a bool", batch)
            if not batch and len(messages) != 1:
                return ValueError(f"Put.messages holds {len(messages)} messages: a put of more is a batch (batch=True)")
        case Get(topic=topic, queue_id=queue_id, offset=offset, max_count=max_count, tags=tags,
                 max_total_bytes=max_total):  # fmt: skip
            for field, value in (("queue_id", queue_id), ("offset", offset), ("max_count", max_count)):
                if not _is_int(value):
                    return _type_error(f"Get.{field}", "an int", value)
            if type(topic) is not str:
                return _type_error("Get.topic", "a str", topic)
            if tags is not None and type(tags) is not str:
                return _type_error("Get.tags", "a str or None", tags)
            if max_total is not None and not _is_int(max_total):
                return _type_error("Get.max_total_bytes", "an int or None", max_total)
            if max_count <= 0:
                return ValueError(f"Get.max_count must be positive, not {max_count}")
            if offset < 0:
                return ValueError(f"Get.offset must not be negative, not {offset}")
        case Query(topic=topic, key=key, max_count=max_count, begin_ms=begin_ms, end_ms=end_ms):
            for field, text in (("topic", topic), ("key", key)):
                if type(text) is not str:
                    return _type_error(f"Query.{field}", "a str", text)
            for field, value in (("max_count", max_count), ("begin_ms", begin_ms), ("end_ms", end_ms)):
                if not _is_int(value):
                    return _type_error(f"Query.{field}", "an int", value)
            if max_count <= 0:
                return ValueError(f"Query.max_count must be positive, not {max_count}")
        case Subscribe(subscriber=subscriber, topic=topic, queue_id=queue_id):
            if not isinstance(subscriber, pykka.ActorRef) and not callable(subscriber):
                return _type_error("Subscribe.subscriber", "an actor ref or a callable", subscriber)
            if topic is not None and type(topic) is not str:
                return _type_error("Subscribe.topic", "a str or None", topic)
            if queue_id is not None and not _is_int(queue_id):
                return _type_error("Subscribe.queue_id", "an int or None", queue_id)
            if queue_id is not None and not 0 <= queue_id <= JAVA_LONG_MAX:
                return ValueError(f"Subscribe.queue_id must be in [0, {JAVA_LONG_MAX}], not {queue_id}")
        case Unsubscribe() | Ping():
            pass
        case _:
            assert_never(request)
    return None


def _described(error: BaseException) -> str:
    """`str(error)`, or what it is if that raises: the error may be of the client's making."""
    try:
        return str(error)
    except Exception:
        return f"<{type(error).__name__} whose str() raised>"


class _Routed(StoreActor[RequestT]):
    """A gateway-side actor: its backend is the store, and a crash restarts the gateway."""

    supervised_as: ClassVar[str | None] = "gateway"

    def __init__(self, ctx: ActorContext, backend: StoreBackend, repeats: RepeatedLog | None = None) -> None:
        super().__init__(ctx)
        self.backend = backend
        # The lines of a client's mistakes, which it can repeat at any rate (review 103 M4: a
        # line per request, ~100k lines/s from one caller telling None in a loop): per kind,
        # in full once, then a line a minute of the store's ticker with the count. One for
        # the gateway and its readers; the gateway's release logs the counts left over.
        self.repeats = repeats if repeats is not None else RepeatedLog(ctx.ticker.now_ms)

    def refuse(self, message: object, why: str) -> None:
        """A message of no known request type: fail its reply if it has one, else log it."""
        try:
            reply = getattr(message, "reply", None)
        except Exception:  # anything a client sends: its attributes may raise
            reply = None
        error = TypeError(f"{self.name} cannot handle {type(message).__name__}: {why}")
        if isinstance(reply, Reply) and host_reply_refusal(reply) is None:
            self._answer_failed(reply, error)
            return
        # Kinds are the client's types: a family, so one making up a type per request gets
        # no line per type either.
        event = "unanswerable request dropped"
        # (By the type's id: a client's metaclass may make hashing the type itself raise,
        # review 104 F4.)
        suppressed = self.repeats.admit((self.name, event, id(type(message)), why), family=(self.name, event))
        if suppressed is not None:
            self.log.warning(event, request=type(message).__name__, why=why, **suppressed_fields(suppressed))

    def _answer_failed(self, reply: Reply[Any], exc: BaseException) -> None:
        """Fail a client's `reply`; what its callback, future or actor raises is logged."""
        try:
            reply.fail(exc)
        except Exception as undeliverable:
            self.log.warning("a request's refusal could not be delivered", error=repr(undeliverable))


class GatewayReader(_Routed[ReaderRequest]):
    """Answers actor clients' gets and queries on its own thread (and its own read maps)."""

    name = "gateway_reader"

    def on_receive(self, message: object) -> object:
        if isinstance(message, (Get, Query, Ping)):
            return super().on_receive(message)
        self.refuse(message, "not a read")
        return None

    def handle(self, message: ReaderRequest) -> Pong | None:
        match message:
            case Get():
                self._answer_read(message.reply, lambda: self.backend.get(
                    message.topic, message.queue_id, message.offset, message.max_count,
                    tags=message.tags, max_total_bytes=message.max_total_bytes))  # fmt: skip
            case Query():
                self._answer_read(message.reply, lambda: self.backend.query(
                    message.topic, message.key, message.max_count, message.begin_ms, message.end_ms))  # fmt: skip
            case Ping():
                return Pong()
            case _:
                assert_never(message)
        return None

    def _answer_read(self, reply: Reply[Any], read: _Read) -> None:
        answer: GetResult | QueryResult | Exception
        try:
            # Read-your-writes for the asking actor: its puts answered as stored before this
            # request are reflected (the actor client notes each before telling Replied).
            with self.backend.reading_for(reply.actor):
                answer = read()
        except Exception as exc:  # the reader's exception is the asker's answer (a bad request)
            answer = exc
        # The asker's Reply is the asker's object: its callback, future or actor may raise
        # anything, which is theirs, never a crash of ours (review 44 H1).
        try:
            if isinstance(answer, Exception):
                reply.fail(answer)
            else:
                reply.send(answer)
        except Exception as exc:
            self.log.warning("a read's answer could not be delivered", error=repr(exc))


class _Read(Protocol):
    def __call__(self) -> GetResult | QueryResult: ...


_GATEWAY_REQUESTS = (Put, Get, Query, Subscribe, Unsubscribe, Ping)


class StoreGateway(_Routed[GatewayRequest]):
    name = "gateway"

    def __init__(self, ctx: ActorContext, backend: StoreBackend) -> None:
        super().__init__(ctx, backend)
        self._readers: list[pykka.ActorRef[GatewayReader]] = []
        self._next_reader = 0

    def on_start(self) -> None:
        for _ in range(GATEWAY_READERS):
            reader = GatewayReader.start(self.ctx, self.backend, self.repeats)
            reader.ask(Ping(), timeout=10)  # the start handshake: nobody talks to a half-started reader
            self._readers.append(reader)

    def release(self) -> None:
        readers, self._readers = self._readers, []
        for reader in readers:
            try:
                reader.stop(block=True, timeout=5)
            except (pykka.ActorDeadError, pykka.Timeout):
                pass
        self.repeats.flush(self.log)  # (a restarted gateway starts a RepeatedLog of its own)

    def on_receive(self, message: object) -> object:
        # Everything a client can send is checked here: a bad request gets an error reply and
        # the gateway carries on; only a bug of ours raises and restarts it.
        if not isinstance(message, _GATEWAY_REQUESTS) or type(message) not in _GATEWAY_REQUESTS:
            # A subclass is the client's code too (a field that raises when read: review 47 F3),
            # and one client's crash would take the actor API from every client while it restarts.
            why = "a subclass of a request type; send the request type itself" if isinstance(message, _GATEWAY_REQUESTS) \
                else "not a gateway request (Put, Get, Query, Subscribe, Unsubscribe)"  # fmt: skip
            self.refuse(message, why)
            return None
        reply = getattr(message, "reply", None)  # (the request types' own fields: plain values)
        if not isinstance(message, (Subscribe, Unsubscribe, Ping)) and not isinstance(reply, Reply):
            self.refuse(message, f"its reply is {type(reply).__name__}, not a Reply")
            return None
        if reply is not None and (why_not := host_reply_refusal(reply)) is not None:
            self.refuse(message, why_not)  # (dropped and logged: answering it would run it here)
            return None
        try:
            error = request_error(message)
        except Exception as exc:  # a field of the client's that raises when read (review 44 H1)
            error = exc
        if error is not None:
            # Its answer carries the error every time; the log, once a minute per kind.
            event = "malformed request answered with an error"
            kind = (self.name, event, id(type(message)), id(type(error)))  # (ids: see `refuse`)
            suppressed = self.repeats.admit(kind, family=(self.name, event))
            if suppressed is not None:
                self.log.info(event, request=type(message).__name__, error=_described(error), **suppressed_fields(suppressed))
            if isinstance(reply, Reply):
                self._answer_failed(reply, error)
            return None
        return super().on_receive(message)  # a bug of ours fails `reply`, then restarts us

    def handle(self, message: GatewayRequest) -> Pong | None:
        self.ctx.faults.hit("gateway.mid_request")
        match message:
            case Put(messages=messages, reply=reply, batch=batch):
                try:  # the writer answers `reply`; only a refusal before it is answered here
                    self.backend.submit_put(tuple(messages), batch=batch, reply=reply)
                except BaseException as exc:
                    # The message is the client's object (a properties mapping, a computed
                    # field) and may raise anything while it is read, SystemExit too (review
                    # 136 F1): its answer, not a restart of ours that counts against the store
                    # (review 44 H1).
                    if not isinstance(exc, (TypeError, ValueError, StoreClosedError)):
                        self.log.warning("a put raised while it was read and encoded", error=repr(exc))
                    self._answer_failed(reply, exc)
            case Get() | Query():
                self._route_read(message)
            case Subscribe(subscriber=subscriber, topic=topic, queue_id=queue_id):
                self._closed_is_fine(lambda: self.backend.subscribe(subscriber, topic, queue_id))
            case Unsubscribe(subscriber=subscriber):
                self._closed_is_fine(lambda: self.backend.unsubscribe(subscriber))
            case Ping():
                return Pong()
            case _:
                assert_never(message)
        return None

    def _closed_is_fine(self, change: Callable[[], None]) -> None:
        """A (un)subscription still queued when the store closed: nothing left to change. One
        the store refuses (or whose subscriber raises when compared) has no reply to carry
        the error: it is logged, and the gateway carries on (review 44 H1)."""
        try:
            change()
        except StoreClosedError:
            self.log.info("subscription change after close ignored")
        except Exception as exc:
            self.log.warning("subscription change refused", error=repr(exc))


    def _route_read(self, request: Get | Query) -> None:
        readers = self._readers
        for _ in range(len(readers)):
            reader = readers[self._next_reader % len(readers)]
            self._next_reader += 1
            try:
                reader.tell(request)
                return
            except pykka.ActorDeadError:
                continue  # it crashed: its report restarts us (and it) soon
        request.reply.fail(pykka.ActorDeadError("the gateway's readers are restarting"))

