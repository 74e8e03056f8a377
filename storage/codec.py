"""The CommitLog record codec, byte-compatible with RocketMQ 4.x (spec §2, §3, §17).

Pure functions over bytes: no I/O, no clocks, no threads. A writer produces only the
4.4.0 V1 form (IPv6 hosts use the 4.6.0 sysflag bits, as every later 4.x broker does);
a reader accepts V1, IPv6 hosts and the 5.1 V2 form (2-byte topic length).
"""

from __future__ import annotations

import functools
import ipaddress
import mmap
import re
import struct
import zlib
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Iterable, Mapping, NamedTuple

from . import speedups
from .foreign import record_feature, refuse_record

# What the decoders read from: bytes, a view, or a segment's map (read-only or writable).
ReadBuffer = bytes | bytearray | memoryview | mmap.mmap

MESSAGE_MAGIC_CODE: Final = -626843481  # 0xDAA320A7
MESSAGE_MAGIC_CODE_V2: Final = -626843477  # 0xDAA320AB, upstream 5.1+
BLANK_MAGIC_CODE: Final = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_LENGTH: Final = 8

MAX_TOPIC_BYTES: Final = 127
MAX_PROPERTIES_BYTES: Final = 32767
DEFAULT_MAX_MESSAGE_SIZE: Final = 4 * 1024 * 1024

# SYSFLAG bits (§3.3)
COMPRESSED_FLAG: Final = 0x01
MULTI_TAGS_FLAG: Final = 0x02
TRANSACTION_MASK: Final = 0x0C
TRANSACTION_NOT_TYPE: Final = 0x00
TRANSACTION_PREPARED_TYPE: Final = 0x04
TRANSACTION_COMMIT_TYPE: Final = 0x08
TRANSACTION_ROLLBACK_TYPE: Final = 0x0C
BORNHOST_V6_FLAG: Final = 0x10
STOREHOSTADDRESS_V6_FLAG: Final = 0x20

# Fixed positions inside a record whose born host is IPv4 (§3.1).
QUEUE_OFFSET_POSITION: Final = 20
PHYSICAL_OFFSET_POSITION: Final = 28
SYSFLAG_POSITION: Final = 36
STORE_TIMESTAMP_POSITION_V4: Final = 56
BODY_SIZE_POSITION_V4: Final = 84

NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"
KEY_SEPARATOR: Final = " "

PROPERTY_KEYS: Final = "KEYS"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_UNIQ_KEY: Final = "UNIQ_KEY"
PROPERTY_WAIT_STORE_MSG_OK: Final = "WAIT"
PROPERTY_DELAY_TIME_LEVEL: Final = "DELAY"
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID: Final = "REAL_QID"

# RocketMQ 4.4.0 MessageConst's names (spec §2.3.4): the store and the broker own them, so a
# user property may not carry one (Java's Message.putUserProperty refuses its systemKeySet).
# A spoofed UNIQ_KEY would be found by `query`, and a DELAY or TRAN_MSG changes delivery.
RESERVED_PROPERTY_NAMES: Final = frozenset(
    {
        PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, PROPERTY_WAIT_STORE_MSG_OK, PROPERTY_DELAY_TIME_LEVEL,
        PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, "RETRY_TOPIC", "TRAN_MSG", "PGROUP", "MIN_OFFSET",
        "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG",
        "RECONSUME_TIME", "MSG_REGION", "TRACE_ON", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME",
        "TRAN_PREPARED_QUEUE_OFFSET", "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS",
        # 4.9.3+/5.x multi-dispatch (storage.foreign): a record carrying it is refused at open.
        "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET",
    }
)  # fmt: skip

JAVA_INT_MAX: Final = 0x7FFFFFFF
JAVA_INT_MIN: Final = -0x80000000
JAVA_LONG_MAX: Final = 0x7FFFFFFFFFFFFFFF
JAVA_LONG_MIN: Final = -0x8000000000000000


def java_int(name: str, value: object, low: int = JAVA_INT_MIN, high: int = JAVA_INT_MAX) -> int:
    """`value` as an int field stored in a Java int or long, within [low, high]: TypeError
    for a non-int (a bool is not a queue id), ValueError naming `name` when out of range
    (rather than struct.error from deep in the encoder, or a value Java cannot read back)."""
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} {value} is outside [{low}, {high}]")
    return value


def check_message_ints(message: Any) -> None:
    """A Message's int fields as the record stores them: queue id a non-negative Java int,
    flag a Java int, born timestamp a Java long (TypeError or ValueError naming the field)."""
    java_int("queue_id", message.queue_id, 0, JAVA_INT_MAX)
    java_int("flag", message.flag)
    if message.born_timestamp_ms is not None:
        java_int("born_timestamp_ms", message.born_timestamp_ms, JAVA_LONG_MIN, JAVA_LONG_MAX)


def check_str(name: str, value: object, what: str = "a str") -> None:
    """TypeError naming `name` unless `value` is exactly a str. A str subclass is refused too:
    an Enum member's text (`f"{Topic.ORDERS}"` is "Topic.ORDERS") and hash differ from its
    value's, so as a topic it keyed a second queue-offset counter for the same queue (PUT_OK
    messages written at taken offsets: review 27), and as a tag it was stored as its name."""
    if type(value) is not str:
        hint = " (a str subclass such as an Enum member: pass its .value)" if isinstance(value, str) else ""
        raise TypeError(f"{name} must be {what}, not {type(value).__name__}{hint}")


def check_message_fields(message: Any) -> None:
    """Every field of a Message the C encoder declined, by type (TypeError naming the field)
    and its ints by range (`check_message_ints`): a field of another type would otherwise be
    stored as its repr (`tags=b"a"` as the tag "b'a'") or fail deep in the encoder. Text
    fields are exact strs (`check_str`)."""
    check_message_ints(message)
    if type(message.wait_store_msg_ok) is not bool:  # "no" and None were taken by their truth
        raise TypeError(f"wait_store_msg_ok must be a bool, not {type(message.wait_store_msg_ok).__name__}")
    check_str("topic", message.topic)
    if message.tags is not None:
        check_str("tags", message.tags, "a str or None")
    if message.born_host is not None and not isinstance(message.born_host, HostAddress):
        check_str("born_host", message.born_host, "a str 'ip:port' or None")
    keys = message.keys
    if type(keys) is not str:
        if not isinstance(keys, (list, tuple)):
            check_str("keys", keys, "a str or a list or tuple of str")
            raise TypeError(f"keys must be a str or a list or tuple of str, not {type(keys).__name__}")
        for key in keys:
            check_str("keys: each key", key)
    properties = message.properties
    if not isinstance(properties, Mapping):
        raise TypeError(f"properties must be a mapping of str to str, not {type(properties).__name__}")
    for name, value in properties.items():
        check_str("properties: each name", name)
        check_str(f"properties: the value of {name!r}", value)


def check_user_properties(properties: Mapping[str, str]) -> None:
    """ValueError naming the first reserved name among a message's user properties."""
    reserved = RESERVED_PROPERTY_NAMES.intersection(properties)
    if reserved:
        names = ", ".join(sorted(reserved))
        raise ValueError(f"property names reserved by RocketMQ (MessageConst): {names}; use the Message fields for keys and tags")


SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
SCHEDULE_TOPIC_UTF8: Final = SCHEDULE_TOPIC.encode()  # what the C dispatch decoder leaves to Python
DEFAULT_MESSAGE_DELAY_LEVEL: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

# RocketMQ's TopicValidator: the allowed characters and the topics a client may not send to.
_VALID_TOPIC = re.compile(r"\A[%|a-zA-Z0-9_-]+\Z")
# The same rule for Spark's rlike (Java regex, whose `$` also matches before a last newline).
TOPIC_NAME_JAVA_REGEX: Final = r"\A[%|a-zA-Z0-9_-]+\z"
RESERVED_TOPICS: Final = frozenset(
    {
        "TBW102",
        SCHEDULE_TOPIC,
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "BenchmarkTest",
    }
)


class TopicError(ValueError):
    """A topic that RocketMQ would refuse, or that is unsafe as a directory name."""


# ---------------------------------------------------------------------------------------
# Java integer arithmetic (§0)


def to_int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - 0x100000000 if x & 0x80000000 else x


def to_int64(x: int) -> int:
    x &= 0xFFFFFFFFFFFFFFFF
    return x - 0x10000000000000000 if x & 0x8000000000000000 else x


def jdiv(a: int, b: int) -> int:
    """Java integer division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def jmod(a: int, b: int) -> int:
    """Java `%`: the result takes the sign of the dividend."""
    return a - b * jdiv(a, b)


# ---------------------------------------------------------------------------------------
# Primitive encodings (§2)


@functools.lru_cache(maxsize=65536)
def java_string_hash(s: str) -> int:
    """Java `String.hashCode`: over UTF-16 code units, wrapped to a signed 32-bit int."""
    h = 0
    if s.isascii():
        for ch in s.encode("ascii"):
            h = (31 * h + ch) & 0xFFFFFFFF
    else:
        units = s.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(units), 2):
            h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """ConsumeQueue tagsCode of a normal message: the tag's Java hash, sign-extended."""
    return java_string_hash(tags) if tags else 0


def index_key_hash(key: str) -> int:
    """IndexFile keyHash: `Math.abs(hashCode)`, with Java's overflow case mapped to 0."""
    h = java_string_hash(key)
    return 0 if h == -2147483648 else abs(h)


def body_crc(body: bytes | bytearray | memoryview | None) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF if body else 0


def java_split(s: str, sep: str) -> list[str]:
    """`String.split` with a one-character literal separator and limit 0."""
    if sep not in s:
        return [s]
    parts = s.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def parse_properties(s: str) -> dict[str, str]:
    """`string2messageProperties`: pairs that do not split into exactly two are dropped."""
    props: dict[str, str] = {}
    if not s:
        return props
    # Equivalent to java_split on both separators: trailing empty items of the outer split
    # would be dropped anyway (an empty item never has two parts), and stripping trailing
    # NAME_VALUE_SEPARATORs is exactly Java's removal of trailing empty strings.
    for item in s.split(PROPERTY_SEPARATOR):
        nv = item.rstrip(NAME_VALUE_SEPARATOR).split(NAME_VALUE_SEPARATOR)
        if len(nv) == 2:
            props[nv[0]] = nv[1]
    return props


def java_hashmap_order(names: Iterable[str]) -> list[str]:
    """The iteration order of a default `java.util.HashMap` holding these names (§2.3.3).

    Bucket order at the final capacity, insertion order within a bucket: Java's resize
    splits each bucket preserving relative order, so this holds for any insertion history.
    """
    return list(_hashmap_order(tuple(dict.fromkeys(names))))


@functools.lru_cache(maxsize=4096)
def _hashmap_order(ordered: tuple[str, ...]) -> tuple[str, ...]:
    # Messages of one application carry the same few property-name sets: cache per set.
    capacity = 16
    while len(ordered) > capacity * 0.75:
        capacity *= 2

    def bucket(name: str) -> int:
        h = java_string_hash(name) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return tuple(sorted(ordered, key=bucket))  # sorted() is stable: insertion order within a bucket


def properties_to_string(props: Mapping[str, str], *, java_order: bool = True) -> str:
    """Serialize as a Java producer would: HashMap iteration order unless told otherwise.

    Names or values holding a separator would not survive the round trip, so they are refused.
    """
    names = _hashmap_order(tuple(props)) if java_order else tuple(props)
    if not all(type(name) is str and type(props[name]) is str for name in names):
        raise TypeError("property names and values must be str")
    if not all(props[name] for name in names):  # what Java's reader drops: refused, not lost
        empty = next(name for name in names if not props[name])
        raise ValueError(f"property {empty!r} has an empty value, which RocketMQ's format drops when the "
                         "record is read (string2messageProperties): leave it out or give it a value")  # fmt: skip
    text = "".join([f"{name}\x01{props[name]}\x02" for name in names])
    # Exactly one separator of each kind per pair: no name or value smuggled one in (one
    # count over the result is cheaper than testing every name and value).
    if text.count(NAME_VALUE_SEPARATOR) != len(names) or text.count(PROPERTY_SEPARATOR) != len(names):
        raise ValueError("a property name or value contains a reserved separator character (\\x01 or \\x02)")
    return text


def parse_delay_levels(spec: str = DEFAULT_MESSAGE_DELAY_LEVEL) -> list[int]:
    """`messageDelayLevel` ("1s 5s ... 2h") as milliseconds; level n is element n-1."""
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    levels = []
    for token in spec.split():
        unit = units.get(token[-1:])
        if unit is None or not token[:-1].isdigit():
            raise ValueError(f"bad delay level {token!r} in {spec!r}")
        levels.append(int(token[:-1]) * unit)
    return levels


def is_topic_name(name: object) -> bool:
    """Whether `name` is spelled as a topic may be (characters and length), reserved topics
    included: for names read from files, which become paths under consumequeue/."""
    return isinstance(name, str) and bool(_VALID_TOPIC.match(name)) and len(name.encode("utf-8")) <= MAX_TOPIC_BYTES


def names_a_queue(topic: object, queue_id: object) -> bool:
    """Whether (topic, queue id) read from a file may name a ConsumeQueue directory."""
    return is_topic_name(topic) and type(queue_id) is int and 0 <= queue_id <= JAVA_INT_MAX


_VALID_TOPICS_SEEN: set[str] = set()  # a store sees few topics; every put checks one


def validate_topic(topic: object) -> str:
    """RocketMQ's topic rules; the topic becomes a directory name, so be strict."""
    if type(topic) is str and topic in _VALID_TOPICS_SEEN:
        return topic
    if not isinstance(topic, str):
        raise TopicError(f"topic must be a str, not {type(topic).__name__}")
    if not topic:
        raise TopicError("topic is empty")
    # The characters first: they are ASCII, so the length in characters is the length in
    # bytes (and a lone surrogate is refused here rather than by the UTF-8 encoder).
    if not _VALID_TOPIC.match(topic):
        shown = repr(topic) if len(topic) <= 60 else f"{topic[:40]!r}..."
        raise TopicError(f"topic {shown} has characters outside [a-zA-Z0-9%|_-]")
    if len(topic) > MAX_TOPIC_BYTES:
        raise TopicError(f"topic is longer than {MAX_TOPIC_BYTES} bytes: {topic[:40]!r}...")
    if topic in RESERVED_TOPICS:
        raise TopicError(f"topic {topic!r} is reserved by RocketMQ")
    if len(_VALID_TOPICS_SEEN) < 65536:
        _VALID_TOPICS_SEEN.add(topic)
    return topic


# ---------------------------------------------------------------------------------------
# Hosts and message ids (§2.5, §3.5)


@dataclass(frozen=True, slots=True)
class HostAddress:
    ip: str
    port: int

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.ip

    def address_bytes(self) -> bytes:
        return ipaddress.ip_address(self.ip).packed

    @classmethod
    def parse(cls, text: str | tuple[str, int] | HostAddress) -> HostAddress:
        """A host to write into a record, checked as Java can read it back. (A HostAddress is
        checked too: one built directly passed any port, review 30; decoding builds them
        unchecked, as a record on disk says what it says.)"""
        if isinstance(text, HostAddress):
            ip, port = text.ip, text.port
            if type(port) is not int:  # 80.9 or "81" or True was stored as an int quietly (review 32)
                raise TypeError(f"HostAddress port must be an int, not {type(port).__name__}")
        elif isinstance(text, tuple):
            ip, port = text
        else:
            ip, sep, port_text = text.rpartition(":")
            if not sep or not port_text.isdigit():
                raise ValueError(f"host {text!r} is not ip:port")
            ip, port = ip.strip("[]"), int(port_text)
        ip = str(ipaddress.ip_address(ip))
        # Java's InetSocketAddress, which RocketMQ's MessageDecoder builds from the record, throws
        # past 65535: a record with such a port could not be read by RocketMQ's tools.
        if not 0 <= int(port) <= 0xFFFF:
            raise ValueError(f"port {port} out of range [0, 65535]")
        if isinstance(text, HostAddress) and ip == text.ip and type(text.port) is int:
            return text
        return cls(ip, int(port))

    @classmethod
    def from_bytes(cls, address: bytes, port: int) -> HostAddress:
        return _host_from_bytes(address, port)

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.is_ipv6 else f"{self.ip}:{self.port}"


@functools.lru_cache(maxsize=4096)
def _host_from_bytes(address: bytes, port: int) -> HostAddress:
    # A store sees few distinct hosts; `ipaddress` costs more than the rest of a decode.
    return HostAddress(str(ipaddress.ip_address(address)), port)


host_from_bytes = _host_from_bytes  # the host factory the C decoders are given (reads.collect)


def msg_id(store_host: HostAddress, commitlog_offset: int) -> str:
    return (store_host.address_bytes() + struct.pack(">iq", store_host.port, commitlog_offset)).hex().upper()


def decode_msg_id(text: str) -> tuple[HostAddress, int]:
    """The store host and commitlog offset an offset message id names."""
    raw = bytes.fromhex(text)
    if len(raw) not in (16, 28):
        raise ValueError(f"msgId {text!r} is neither 32 nor 56 hex digits")
    alen = len(raw) - 12
    port, offset = struct.unpack_from(">iq", raw, alen)
    return HostAddress.from_bytes(raw[:alen], port), offset


# ---------------------------------------------------------------------------------------
# Record sizes and encoding (§3)


def cal_msg_length(body_len: int, topic_len: int, props_len: int, sys_flag: int = 0, v2: bool = False) -> int:
    born = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    store = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    return 74 + born + store + max(body_len, 0) + (2 if v2 else 1) + topic_len + max(props_len, 0)


def store_timestamp_position(sys_flag: int) -> int:
    return STORE_TIMESTAMP_POSITION_V4 + (12 if sys_flag & BORNHOST_V6_FLAG else 0)


_HEAD = struct.Struct(">iiiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP (48 bytes)
_HEAD_V4V4 = struct.Struct(">iiiiiqqiq4siq4siiqi")  # the whole fixed part with IPv4 hosts
_HOST_PORT = struct.Struct(">i")
_TAIL = struct.Struct(">iqi")  # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLENGTH
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_II = struct.Struct(">ii")
_H = struct.Struct(">h")
_B = struct.Struct(">b")


class MessageTooLarge(ValueError):
    """The encoded record exceeds maxMessageSize (MESSAGE_SIZE_EXCEEDED)."""


class PropertiesTooLarge(ValueError):
    """The properties string exceeds 32767 UTF-8 bytes (PROPERTIES_SIZE_EXCEEDED)."""


def encode_message(
    *,
    topic: str,
    queue_id: int,
    body: bytes,
    properties: str,
    flag: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_host: HostAddress,
    store_host: HostAddress,
    store_timestamp: int = 0,
    queue_offset: int = 0,
    commitlog_offset: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> bytes:
    """Encode one V1 record (§3.1). Offsets and the store timestamp may be patched later."""
    topic_bytes = topic.encode("utf-8")
    if not 0 < len(topic_bytes) <= MAX_TOPIC_BYTES:
        raise TopicError(f"topic must be 1..{MAX_TOPIC_BYTES} UTF-8 bytes")
    props_bytes = properties.encode("utf-8")
    if len(props_bytes) > MAX_PROPERTIES_BYTES:
        raise PropertiesTooLarge(f"properties are {len(props_bytes)} bytes, more than {MAX_PROPERTIES_BYTES}")
    sys_flag &= ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    if born_host.is_ipv6:
        sys_flag |= BORNHOST_V6_FLAG
    if store_host.is_ipv6:
        sys_flag |= STOREHOSTADDRESS_V6_FLAG
    total = cal_msg_length(len(body), len(topic_bytes), len(props_bytes), sys_flag)
    if total > max_message_size:
        raise MessageTooLarge(f"record of {total} bytes exceeds maxMessageSize {max_message_size}")
    crc = zlib.crc32(body) & 0x7FFFFFFF if body else 0
    if not sys_flag & (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG):
        head = _HEAD_V4V4.pack(
            total, MESSAGE_MAGIC_CODE, crc, queue_id, flag, queue_offset, commitlog_offset, sys_flag,
            born_timestamp, _ipv4_bytes(born_host.ip), born_host.port, store_timestamp,
            _ipv4_bytes(store_host.ip), store_host.port, reconsume_times, prepared_transaction_offset, len(body),
        )  # fmt: skip
    else:
        head = b"".join(
            (
                _HEAD.pack(total, MESSAGE_MAGIC_CODE, crc, queue_id, flag, queue_offset, commitlog_offset,
                           sys_flag, born_timestamp),  # fmt: skip
                born_host.address_bytes(),
                _HOST_PORT.pack(born_host.port),
                _Q.pack(store_timestamp),
                store_host.address_bytes(),
                _HOST_PORT.pack(store_host.port),
                _TAIL.pack(reconsume_times, prepared_transaction_offset, len(body)),
            )
        )
    return b"".join((head, body, _B.pack(len(topic_bytes)), topic_bytes, _H.pack(len(props_bytes)), props_bytes))


@functools.lru_cache(maxsize=1024)
def _ipv4_bytes(ip: str) -> bytes:
    return ipaddress.IPv4Address(ip).packed


def blank_record_header(max_blank: int) -> bytes:
    """The END_OF_FILE filler's 8 header bytes (§3.7); the rest of the file is left zero."""
    return _II.pack(max_blank, BLANK_MAGIC_CODE)


def patch_record(
    buf: bytearray | memoryview, pos: int, *, queue_offset: int, commitlog_offset: int, store_timestamp: int | None
) -> None:
    """Fill in what only the writer knows, as RocketMQ 4.9.3+ does inside its put lock."""
    _Q.pack_into(buf, pos + QUEUE_OFFSET_POSITION, queue_offset)
    _Q.pack_into(buf, pos + PHYSICAL_OFFSET_POSITION, commitlog_offset)
    if store_timestamp is not None:
        sys_flag = _I.unpack_from(buf, pos + SYSFLAG_POSITION)[0]
        _Q.pack_into(buf, pos + store_timestamp_position(sys_flag), store_timestamp)


# ---------------------------------------------------------------------------------------
# Decoding (§8.3, Appendix E)


class RecordKind(Enum):
    MESSAGE = "message"
    BLANK = "blank"  # END_OF_FILE filler: continue at the next segment
    END_OF_DATA = "end_of_data"  # unwritten (zero) space: the log ends here
    CORRUPT = "corrupt"  # something that is neither a record nor clean unwritten space


class MessageRecord(NamedTuple):
    """A decoded CommitLog message record (the fields of §3.1). Immutable; a NamedTuple
    because reads build one per message and a frozen dataclass costs four times as much."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commitlog_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: HostAddress
    store_timestamp: int
    store_host: HostAddress
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties_raw: str
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @property
    def key_list(self) -> list[str]:
        keys = self.properties.get(PROPERTY_KEYS)
        return [k for k in java_split(keys, KEY_SEPARATOR) if k] if keys else []

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def transaction_type(self) -> int:
        return self.sys_flag & TRANSACTION_MASK

    @property
    def msg_id(self) -> str:
        return msg_id(self.store_host, self.commitlog_offset)

    @property
    def is_v2(self) -> bool:
        return self.magic == MESSAGE_MAGIC_CODE_V2

    def tags_code(self, delay_levels_ms: list[int] | None = None) -> int:
        return compute_tags_code(self.topic, self.properties, self.store_timestamp, delay_levels_ms)


def compute_tags_code(
    topic: str, properties: Mapping[str, str], store_timestamp: int, delay_levels_ms: list[int] | None = None
) -> int:
    """§8.3: the tag hash, or for a delayed message in the schedule topic its delivery time."""
    if topic == SCHEDULE_TOPIC:
        delay = properties.get(PROPERTY_DELAY_TIME_LEVEL)
        if delay is not None:
            levels = delay_levels_ms if delay_levels_ms is not None else _default_delay_levels()
            try:
                level = min(int(delay), len(levels))
            except ValueError:
                level = 0
            if level > 0:
                return store_timestamp + levels[level - 1]
    return tags_code(properties.get(PROPERTY_TAGS))


@functools.lru_cache(maxsize=1)
def _default_delay_levels() -> list[int]:
    return parse_delay_levels()


class RecordRead(NamedTuple):
    """What a reader found at `offset` (a position in the buffer it was given). A NamedTuple:
    one is built per record read.

    `size` is how far to advance for MESSAGE; for CORRUPT it is the header's size when that
    size was plausible, else 0. `reason` says what was wrong, for people.
    """

    kind: RecordKind
    offset: int
    size: int
    record: MessageRecord | None = None
    reason: str = ""


_FIXED_AFTER_BORN = struct.Struct(">iq")  # born port, store timestamp
_STORE_TAIL = struct.Struct(">iiqi")  # store port, reconsume, prepared offset, body length


# The body CRC is the only checksum of a 4.x record: a torn write that keeps the header and
# body but not the end of the properties passes it. Every writer (Java's
# messageProperties2String, ours) ends non-empty properties with PROPERTY_SEPARATOR, so
# the integrity checks (check_crc: recovery, verify) also require that last byte.
_PROPERTY_SEPARATOR_BYTE: Final = 0x02
_TORN_PROPERTIES: Final = "properties do not end with their separator (a torn write)"
CRC_MISMATCH: Final = "body CRC mismatch"
INTEGRITY_FAILURES: Final = frozenset({CRC_MISMATCH, _TORN_PROPERTIES})  # what `check_crc` adds


def failed_integrity(read: RecordRead) -> bool:
    """Whether `read` is a well-formed record that fails the checks of `check_crc` (a body
    CRC mismatch or torn properties): damage, as opposed to a position that is no record."""
    return read.kind is RecordKind.CORRUPT and read.reason in INTEGRITY_FAILURES


def read_record(
    buf: ReadBuffer,
    pos: int,
    limit: int | None = None,
    *,
    check_crc: bool = False,
    read_body: bool = True,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> RecordRead:
    """Decode the record at `pos`, never reading at or past `limit` (default: len(buf)).

    Every malformed input yields CORRUPT (or END_OF_DATA for zeroed space) rather than an
    exception, and a corrupt size is bounded by `max_message_size` and `limit`, so a damaged
    file can neither crash nor make the reader allocate or loop.
    """
    end = len(buf) if limit is None else min(limit, len(buf))
    if pos < 0:
        return RecordRead(RecordKind.CORRUPT, pos, 0, reason=f"position {pos} is before the buffer")
    if pos + 8 > end:
        if pos >= end or not any(buf[pos:end]):
            return RecordRead(RecordKind.END_OF_DATA, pos, 0, reason="end of readable data")
        return RecordRead(RecordKind.CORRUPT, pos, 0, reason=f"{end - pos} trailing bytes, too short for a header")
    total, magic = _II.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return RecordRead(RecordKind.BLANK, pos, total)
    if magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2:
        if total == 0 and magic == 0:
            return RecordRead(RecordKind.END_OF_DATA, pos, 0, reason="unwritten space")
        return RecordRead(RecordKind.CORRUPT, pos, 0, reason=f"bad magic code 0x{magic & 0xFFFFFFFF:08X}")
    v2 = magic == MESSAGE_MAGIC_CODE_V2
    min_len = cal_msg_length(0, 0, 0, 0, v2)
    if total < min_len or total > max_message_size:
        return RecordRead(RecordKind.CORRUPT, pos, 0, reason=f"record size {total} outside [{min_len}, {max_message_size}]")
    if pos + total > end:
        return RecordRead(RecordKind.CORRUPT, pos, 0, reason=f"record size {total} runs past the readable end")
    try:
        return _decode_message(buf, pos, total, magic, v2, check_crc, read_body)
    except (struct.error, ValueError, IndexError) as exc:
        return RecordRead(RecordKind.CORRUPT, pos, 0, reason=f"undecodable record: {exc}")


def _decode_message(
    buf: ReadBuffer, pos: int, total: int, magic: int, v2: bool, check_crc: bool, read_body: bool
) -> RecordRead:
    rec_end = pos + total
    _, _, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts = _HEAD.unpack_from(buf, pos)
    p = pos + 48
    alen = 16 if sys_flag & BORNHOST_V6_FLAG else 4
    born_addr = bytes(buf[p : p + alen])
    born_port, store_ts = _FIXED_AFTER_BORN.unpack_from(buf, p + alen)
    p += alen + 12
    alen = 16 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 4
    store_addr = bytes(buf[p : p + alen])
    store_port, reconsume, prepared, body_len = _STORE_TAIL.unpack_from(buf, p + alen)
    p += alen + 20
    if body_len < 0 or p + body_len > rec_end:
        return RecordRead(RecordKind.CORRUPT, pos, total, reason=f"body length {body_len} does not fit the record")
    body_at = p
    p += body_len
    if v2:
        topic_len = _H.unpack_from(buf, p)[0]
        p += 2
    else:
        topic_len = _B.unpack_from(buf, p)[0]
        p += 1
    if topic_len <= 0 or p + topic_len + 2 > rec_end:
        return RecordRead(RecordKind.CORRUPT, pos, total, reason=f"topic length {topic_len} does not fit the record")
    topic_at = p
    p += topic_len
    props_len = _H.unpack_from(buf, p)[0]
    p += 2
    if props_len < 0 or p + props_len > rec_end:
        return RecordRead(RecordKind.CORRUPT, pos, total, reason=f"properties length {props_len} does not fit")
    # The lengths before the CRC: a resync past damage tries many candidate headers, and a
    # record may now be as large as a segment (a CRC over up to 1 GiB for each false one).
    if total != cal_msg_length(body_len, topic_len, props_len, sys_flag, v2):
        return RecordRead(RecordKind.CORRUPT, pos, total, reason="TOTALSIZE disagrees with the field lengths")
    body = bytes(buf[body_at : body_at + body_len]) if read_body else b""
    if check_crc and read_body and body_len > 0 and (zlib.crc32(body) & 0x7FFFFFFF) != crc:
        return RecordRead(RecordKind.CORRUPT, pos, total, reason=CRC_MISMATCH)
    topic = bytes(buf[topic_at : topic_at + topic_len]).decode("utf-8", "replace")
    if check_crc and props_len > 0 and buf[p + props_len - 1] != _PROPERTY_SEPARATOR_BYTE:
        return RecordRead(RecordKind.CORRUPT, pos, total, reason=_TORN_PROPERTIES)
    props_raw = bytes(buf[p : p + props_len]).decode("utf-8", "replace") if props_len > 0 else ""
    record = MessageRecord(
        total_size=total,
        magic=magic,
        body_crc=crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        commitlog_offset=phys,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=HostAddress.from_bytes(born_addr, born_port),
        store_timestamp=store_ts,
        store_host=HostAddress.from_bytes(store_addr, store_port),
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body=body,
        topic=topic,
        properties_raw=props_raw,
        properties=parse_properties(props_raw),
    )
    return RecordRead(RecordKind.MESSAGE, pos, total, record)


def read_message(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int,
    limit: int | None = None,
    *,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    check_crc: bool = False,
) -> MessageRecord | None:
    """The message record `read_record` finds at `pos`, or None where it finds anything else
    (`read_served` says what that was)."""
    found = read_served(buf, pos, limit, max_message_size=max_message_size, check_crc=check_crc)
    return found if type(found) is MessageRecord else None


def read_served(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int,
    limit: int | None = None,
    *,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    check_crc: bool = False,
) -> MessageRecord | RecordRead:
    """The read path's entry (get, query, lookup): the message record at `pos`, or the
    RecordRead of what lies there instead (kind CORRUPT with its reason for a record whose body
    fails its CRC under `check_crc`, or any other damage; BLANK; END_OF_DATA).

    The C decoder builds the record straight from `buf` (checking the CRC itself), and
    whatever it declines goes through `read_record`, the reference. `buf` may be a map:
    nothing of it is kept past this call.
    """
    fast = speedups.native
    if fast is not None:
        record: MessageRecord | None = fast.decode_message(
            buf, pos, limit, max_message_size, MessageRecord, _host_from_bytes, check_crc
        )
        if record is not None:
            return record
    read = read_record(buf, pos, limit, check_crc=check_crc, max_message_size=max_message_size)
    return read.record if read.kind is RecordKind.MESSAGE and read.record is not None else read


def body_crc_mismatch(buf: Any, pos: int, limit: int | None = None) -> str:
    """For a reader that decodes records itself (the Spark reader) or serves them raw: "" if
    the record at `pos` passes the integrity checks of `read_record(check_crc=True)` (body CRC,
    properties ending in their separator), else the reason it fails (CRC_MISMATCH, or the
    reason whatever lies at `pos` is not a well-formed record). The C kernel checks a V1 record
    with IPv4 hosts in place (zlib's CRC over the map, no copy); the rest goes to the reference."""
    fast = speedups.native
    if fast is not None:
        ok: bool | None = fast.check_record_crc(buf, pos, limit)
        if ok is not None:
            return "" if ok else _integrity_reason(buf, pos, limit)
    read = read_record(buf, pos, limit, check_crc=True)
    return "" if read.kind is RecordKind.MESSAGE else read.reason or read.kind.value


def _integrity_reason(buf: Any, pos: int, limit: int | None) -> str:
    """Which integrity check a record the C kernel failed fails (rare: damage only)."""
    return read_record(buf, pos, limit, check_crc=True).reason or CRC_MISMATCH


def encode_record(record: MessageRecord) -> bytes:
    """Re-encode a decoded record; for a V1 record this reproduces its bytes exactly."""
    if record.is_v2:
        raise ValueError("this store writes V1 records only")
    return encode_message(
        topic=record.topic,
        queue_id=record.queue_id,
        body=record.body,
        properties=record.properties_raw,
        flag=record.flag,
        sys_flag=record.sys_flag,
        born_timestamp=record.born_timestamp,
        born_host=record.born_host,
        store_host=record.store_host,
        store_timestamp=record.store_timestamp,
        queue_offset=record.queue_offset,
        commitlog_offset=record.commitlog_offset,
        reconsume_times=record.reconsume_times,
        prepared_transaction_offset=record.prepared_transaction_offset,
        max_message_size=max(DEFAULT_MAX_MESSAGE_SIZE, record.total_size),
    )


def segment_file_name(offset: int) -> str:
    """CommitLog and ConsumeQueue segment names: the start offset, 20 zero-padded digits."""
    return "%020d" % offset


# ---------------------------------------------------------------------------------------
# ConsumeQueue units (§9.1)

# A filler unit (CQ_UNIT (0, FILLER_UNIT_SIZE, 0), RocketMQ's pre-blank unit): a queue offset held
# for a record not in the log, pointing at nothing. Its test is consume_queue.is_filler.
FILLER_UNIT_SIZE: Final = JAVA_INT_MAX
CQ_STORE_UNIT_SIZE: Final = 20
CQ_UNIT: Final = struct.Struct(">qiq")


def encode_cq_unit(commitlog_offset: int, size: int, tags_code_value: int) -> bytes:
    return CQ_UNIT.pack(commitlog_offset, size, tags_code_value)


# ---------------------------------------------------------------------------------------
# The dispatcher's partial decode (§8.3 with readBody=false): only what ConsumeQueue and
# index building need, without copying bodies or building host objects.

_DISPATCH_HEAD_V4 = struct.Struct(">iiiiiqqiq8xq8xiqi")  # fixed part, IPv4 hosts skipped


class DispatchFields(NamedTuple):
    topic: str
    queue_id: int
    commitlog_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    consume_queue_offset: int
    keys: str | None
    uniq_key: str | None
    sys_flag: int
    prepared_transaction_offset: int


def read_dispatch(
    buf: Any,
    pos: int,
    limit: int,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    delay_levels_ms: list[int] | None = None,
    check_crc: bool = False,
) -> tuple[RecordKind, int, DispatchFields | None]:
    """(kind, size, fields) of the record at `pos`: checkMessageAndReturnSize without copying
    the body (with `check_crc`, the body CRC is checked in place, as recovery needs).

    Falls back to the full decoder for IPv6 hosts and V2 records (rare; correctness first).
    A record of a feature mqstore does not implement (INNER_BATCH / NEED_UNWRAP sysflags, the
    INNER_MULTI_QUEUE_OFFSET a broker writes into a record it multi-dispatched: storage.foreign) raises ForeignStoreError: dispatched as one
    ordinary message it would serve a batch's bytes as a body or leave LMQ queues behind.
    """
    if pos + 8 > limit:
        return RecordKind.END_OF_DATA, 0, None
    total, magic = _II.unpack_from(buf, pos)
    if magic == MESSAGE_MAGIC_CODE and 91 <= total <= max_message_size and pos + total <= limit:
        (_, _, crc, queue_id, _, queue_offset, phys, sys_flag, _, store_ts, _, prepared, body_len) = (
            _DISPATCH_HEAD_V4.unpack_from(buf, pos)
        )
        if not sys_flag & (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG) and 0 <= body_len <= total - 91:
            if check_crc and body_len and zlib.crc32(memoryview(buf)[pos + 88 : pos + 88 + body_len]) & 0x7FFFFFFF != crc:
                return RecordKind.CORRUPT, 0, None
            p = pos + 88 + body_len
            topic_len = buf[p]
            if topic_len > 127 or 91 + body_len + topic_len > total:
                return RecordKind.CORRUPT, 0, None
            props_len = _H.unpack_from(buf, p + 1 + topic_len)[0]
            if total != 91 + body_len + topic_len + props_len or props_len < 0:
                return RecordKind.CORRUPT, 0, None
            if check_crc and props_len and buf[p + 2 + topic_len + props_len] != _PROPERTY_SEPARATOR_BYTE:
                return RecordKind.CORRUPT, 0, None
            topic = str(buf[p + 1 : p + 1 + topic_len], "utf-8", "replace")
            keys = uniq = None
            code = 0
            props = None
            if props_len:
                start = p + 3 + topic_len
                props = parse_properties(str(buf[start : start + props_len], "utf-8", "replace"))
            if (feature := record_feature(sys_flag, props)) is not None:
                raise refuse_record(phys, topic, feature)
            if props is not None:
                keys = props.get(PROPERTY_KEYS)
                uniq = props.get(PROPERTY_UNIQ_KEY)
                code = compute_tags_code(topic, props, store_ts, delay_levels_ms)
            else:
                keys = ""  # §8.4: a record without properties has keys "" and no uniq key
            return RecordKind.MESSAGE, total, DispatchFields(
                topic, queue_id, phys, total, code, store_ts, queue_offset, keys, uniq, sys_flag, prepared
            )
    read = read_record(buf, pos, limit, check_crc=check_crc, read_body=check_crc, max_message_size=max_message_size)
    if read.kind is not RecordKind.MESSAGE or read.record is None:
        return read.kind, read.size, None
    r = read.record
    if (feature := record_feature(r.sys_flag, r.properties, r.topic)) is not None:
        raise refuse_record(r.commitlog_offset, r.topic[:80], feature)
    return RecordKind.MESSAGE, r.total_size, DispatchFields(
        r.topic, r.queue_id, r.commitlog_offset, r.total_size, r.tags_code(delay_levels_ms), r.store_timestamp,
        r.queue_offset, r.keys if r.properties_raw else "", r.uniq_key, r.sys_flag, r.prepared_transaction_offset,
    )  # fmt: skip
