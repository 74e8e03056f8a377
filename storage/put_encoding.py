"""A put's pre-checks and encoding (DefaultMessageStore.putMessage(s) §6.1, the record §6.2),
done in the caller's thread before the writer sees it (as RocketMQ builds the record before
its put lock). Pure: the time and the hosts are passed in; no I/O, no actors.

The answer is either the encoded records or a `PutRefused` (an operating outcome: the caller
turns it into a PutResult without reaching the writer). Wrong types raise TypeError naming
the argument, out-of-range values ValueError: those are the caller's mistakes.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, NamedTuple, Protocol, Sequence

from . import codec, speedups
from .status import PutMessageStatus

__all__ = ["EncodedBatch", "PutEncoder", "PutRefused", "PutMessageLike", "message_properties"]

_DEFAULT_BORN_HOST = codec.HostAddress("127.0.0.1", 0)
_DEFAULT_BORN_IP4 = _DEFAULT_BORN_HOST.address_bytes()
_DEFAULT_BORN_PORT = _DEFAULT_BORN_HOST.port
_TOPICS_CACHED = 4096


class PutMessageLike(Protocol):
    """What a put needs of a message (`mqstore.Message` is one)."""

    @property
    def topic(self) -> str: ...
    @property
    def body(self) -> bytes | bytearray | memoryview: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def tags(self) -> str | None: ...
    @property
    def keys(self) -> Sequence[str] | str: ...
    @property
    def properties(self) -> Mapping[str, str]: ...
    @property
    def flag(self) -> int: ...
    @property
    def born_timestamp_ms(self) -> int | None: ...
    @property
    def born_host(self) -> str | None: ...
    @property
    def wait_store_msg_ok(self) -> bool: ...


class PutRefused(NamedTuple):
    status: PutMessageStatus
    detail: str


class EncodedBatch(NamedTuple):
    records: tuple[bytes, ...]
    sys_flag: int
    sync_wait: bool  # every message waits for the store's answer (WAIT property not "false")


class PutEncoder:
    """Encodes puts for one store (its host address and message size limit)."""

    def __init__(
        self,
        store_host: codec.HostAddress,
        max_message_size: int,
        claim_topic: Callable[[str], PutRefused | None] | None = None,
    ) -> None:
        self.store_host = store_host
        self.max_message_size = max_message_size
        self._store_host_ip4 = None if store_host.is_ipv6 else store_host.address_bytes()
        self._store_port = store_host.port
        # Topics that passed validate_topic, with their UTF-8 bytes: the checks and the encoding
        # of a topic are paid once, not per put (bounded: a host with endless topic names
        # validates the ones past the bound on every put, as before).
        self._topic_utf8: dict[str, bytes] = {}
        # `claim_topic` gives a topic new to the store its directory (or refuses the put)
        # before its first put is taken; the topics it took (unbounded: each has a directory).
        self._claim_topic = claim_topic
        self._claimed: set[str] = set()

    def forget_topics(self, topics: Iterable[str]) -> None:
        """Topics whose directories were removed (cleanUnusedTopic): their next put claims a
        directory again (review 72 H1: on a case-insensitive filesystem a case variant took
        the freed name, and a put of the old spelling was taken and then held all dispatch)."""
        for topic in topics:
            self._claimed.discard(topic)
            self._topic_utf8.pop(topic, None)  # the C submitter's cache: it declines the topic now

    def native_submitter(
        self, clock_ms: Callable[[], int], slots: object, put_type: type, envelope_type: type, message_type: type,
        max_record_bytes: int | None = None,
    ) -> Any | None:
        """A `_native.PutSubmitter` that encodes a single plain message as `encode` does (its
        C encoder, this encoder's validated topics, hosts and limit) and hands it to the
        writer in the same call; None without the C extension or with an IPv6 store host.
        `max_record_bytes`: it declines records larger than this (left to `encode`)."""
        native = speedups.native
        if native is None or self._store_host_ip4 is None:
            return None
        return native.PutSubmitter(
            self._topic_utf8, clock_ms, slots, put_type, envelope_type, message_type,
            _DEFAULT_BORN_IP4, _DEFAULT_BORN_PORT, self._store_host_ip4, self._store_port,
            self.max_message_size if max_record_bytes is None else min(self.max_message_size, max_record_bytes),
        )  # fmt: skip

    def encode(self, messages: Sequence[PutMessageLike], batch: bool, now_ms: int) -> EncodedBatch | PutRefused:
        """The pre-checks, then the records (the C encoder for plain messages). A text field
        that UTF-8 cannot hold (a lone surrogate) is a ValueError naming the field."""
        try:
            encoded = self._encode(messages, batch, now_ms)
        except UnicodeEncodeError as exc:
            raise ValueError(f"{_unencodable_field(messages)} cannot be encoded as UTF-8: {exc.reason} "
                             f"({exc.object[exc.start:exc.end]!r})") from exc  # fmt: skip
        if type(encoded) is EncodedBatch:
            topic: str = messages[0].topic
            if topic not in self._claimed:
                # Last, once every other check passed: a refused put leaves no directory.
                if self._claim_topic is not None:
                    refused = self._claim_topic(topic)
                    if refused is not None:
                        return refused
                self._claimed.add(topic)
                if len(self._topic_utf8) < _TOPICS_CACHED:
                    self._topic_utf8[topic] = topic.encode("utf-8")
        return encoded

    def _encode(self, messages: Sequence[PutMessageLike], batch: bool, now_ms: int) -> EncodedBatch | PutRefused:
        if not messages:
            raise ValueError("messages: no messages to put")
        if not batch and len(messages) != 1:
            # The writer labels a put by its first message and gives a single put one queue
            # offset: more records were appended at another queue's offsets (review 131 F1: a
            # gateway Put whose list changed, or lied in __len__, after the gateway's check).
            raise ValueError(f"messages: {len(messages)} messages in a put that is not a batch (batch=True)")
        first = messages[0]
        topic = first.topic
        topic_utf8 = self._topic_utf8.get(topic) if type(topic) is str else None
        if topic_utf8 is None:
            if isinstance(topic, str):
                codec.check_str("topic", topic)  # the writer keys its queues by this object
            try:
                codec.validate_topic(topic)
            except codec.TopicError as exc:
                return PutRefused(PutMessageStatus.MESSAGE_ILLEGAL, str(exc))
            topic_utf8 = topic.encode("utf-8")  # cached by `encode` once the topic is claimed
        max_size = self.max_message_size
        fast = speedups.native
        queue_id = first.queue_id
        store_ip4 = self._store_host_ip4
        if fast is not None and store_ip4 is not None and type(queue_id) is int and 0 <= queue_id <= 0x7FFFFFFF:
            # The C encoder takes plain messages of the first one's topic and queue whole or
            # none; anything it declines (custom properties, a born host, a mixed batch, an
            # error to report) goes through the checks and the loop below.
            encoded = fast.encode_batch(
                messages, topic_utf8, now_ms, _DEFAULT_BORN_IP4, _DEFAULT_BORN_PORT,
                store_ip4, self._store_port, max_size, topic, queue_id,
            )  # fmt: skip
            if encoded is not None:
                if batch:
                    total = sum(map(len, encoded))
                    if total > max_size:
                        return PutRefused(PutMessageStatus.MESSAGE_ILLEGAL, f"batch of {total} bytes > {max_size}")
                return EncodedBatch(encoded, 0, True)
        for message in messages:
            codec.check_message_fields(message)  # TypeError/ValueError naming the field: the caller's mistake
        if batch and any(m.topic != first.topic or m.queue_id != first.queue_id for m in messages):
            return PutRefused(PutMessageStatus.MESSAGE_ILLEGAL, "a batch must have one topic and queue")
        records = []
        total = 0
        for message in messages:
            if not isinstance(message.body, (bytes, bytearray, memoryview)):
                raise TypeError(f"message body must be bytes, not {type(message.body).__name__}")
            try:
                props = message_properties(message)
            except ValueError as exc:
                return PutRefused(PutMessageStatus.MESSAGE_ILLEGAL, str(exc))
            if len(props) > codec.MAX_PROPERTIES_BYTES:  # Java's pre-check counts UTF-16 chars
                return PutRefused(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, f"{len(props)} chars")
            born = codec.HostAddress.parse(message.born_host) if message.born_host else _DEFAULT_BORN_HOST
            try:
                data = codec.encode_message(
                    topic=message.topic,
                    queue_id=message.queue_id,
                    body=bytes(message.body),
                    properties=props,
                    flag=message.flag,
                    born_timestamp=message.born_timestamp_ms if message.born_timestamp_ms is not None else now_ms,
                    born_host=born,
                    store_host=self.store_host,
                    max_message_size=max_size,
                )
            except (codec.MessageTooLarge, codec.PropertiesTooLarge) as exc:
                return PutRefused(PutMessageStatus.MESSAGE_ILLEGAL, str(exc))
            total += len(data)
            records.append(data)
        if batch and total > max_size:
            return PutRefused(PutMessageStatus.MESSAGE_ILLEGAL, f"batch of {total} bytes > {max_size}")
        return EncodedBatch(tuple(records), 0, all(m.wait_store_msg_ok for m in messages))


def message_properties(message: PutMessageLike) -> str:
    """The record's properties string: KEYS and TAGS (and WAIT=false) over the message's own
    properties. ValueError if a key or tag cannot round-trip (a space in a key, a separator)."""
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
    codec.check_user_properties(message.properties)
    props = dict(message.properties)
    if message.tags:
        props[codec.PROPERTY_TAGS] = message.tags
    if joined:
        props[codec.PROPERTY_KEYS] = joined
    if not message.wait_store_msg_ok:
        props[codec.PROPERTY_WAIT_STORE_MSG_OK] = "false"
    return codec.properties_to_string(props) if props else ""


def _unencodable_field(messages: Sequence[PutMessageLike]) -> str:
    """Which text field of `messages` UTF-8 cannot encode (for the error), as "messages[i].field"."""
    for i, message in enumerate(messages):
        keys = message.keys
        texts: list[tuple[str, object]] = [("topic", message.topic), ("tags", message.tags), ("born_host", message.born_host)]
        texts += [("keys", key) for key in ([keys] if isinstance(keys, str) else keys)]
        texts += [(f"properties[{name!r}]", f"{name}{value}") for name, value in message.properties.items()]
        for field, text in texts:
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    return f"messages[{i}].{field}" if len(messages) > 1 else field
    return "a text field"
