"""What RocketMQ writes in the modes mqstore does not implement, found cheaply, so that a store
that uses them is refused (a writable open, `mqstore recover`, the CLI tools that would misread
it) and `inspect` reports it, instead of its records being served as ordinary messages or its
queues being "repaired" into mqstore's format (review 61 H1-H3, M2):

- multi-dispatch / LMQ (RocketMQ 4.9.3+, 5.x): records a broker multi-dispatched (it writes the
  INNER_MULTI_QUEUE_OFFSET property into them; INNER_MULTI_DISPATCH alone is the producer's, kept
  as is by a broker with enableMultiDispatch off, the default, and such a record is an ordinary
  message), and `consumequeue/%LMQ%<name>/` queues whose units point at another topic's records;
- ConsumeQueueExt (enableConsumeQueueExt): `consumequeue_ext/`, and units whose tagsCode is an
  ext address (ConsumeQueueExt.isExtAddr: at most Integer.MIN_VALUE - 1);
- BatchConsumeQueue (5.x): `batchconsumequeue/`, records with sysflag INNER_BATCH (0x80) and
  NEED_UNWRAP (0x40), which wrap several messages in one body;
- DLedger: `dledger-<id>/data/` logs, whose entries put a 48-byte header before each record;
- topics longer than 4.x's 127 bytes (5.x V2 records): a queue directory so named, or such a
  record where records are decoded (short-topic V2 records are read as any other).

The rule is the project's first: never dispatch, cut, rewrite or delete what this store does
not understand; refuse loudly, naming the feature and where it was found.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from .lockfiles import StoreDirectoryError

if TYPE_CHECKING:
    from ..config import StoreConfig
    from .fs import FileSystem

__all__ = [
    "FOREIGN_SYSFLAGS", "ForeignStoreError", "INNER_BATCH_FLAG", "NEED_UNWRAP_FLAG", "PROPERTY_INNER_MULTI_DISPATCH",
    "PROPERTY_INNER_MULTI_QUEUE_OFFSET", "SUPPORTED",
    "foreign_layout", "is_ext_address", "other_layout_directories", "record_feature", "refuse_foreign_layout",
    "refuse_record",
]  # fmt: skip

# MessageSysFlag (RocketMQ 5.x): a record whose body holds several encoded messages.
NEED_UNWRAP_FLAG: Final = 0x40
INNER_BATCH_FLAG: Final = 0x80
FOREIGN_SYSFLAGS: Final = NEED_UNWRAP_FLAG | INNER_BATCH_FLAG
# MessageConst: the LMQ queues a record is dispatched to besides its own (MixAll.LMQ_PREFIX).
PROPERTY_INNER_MULTI_DISPATCH: Final = "INNER_MULTI_DISPATCH"
# Written by the broker's MultiDispatch.wrapMultiDispatch, only when it dispatched the record to
# those queues (enableMultiDispatch): the LMQ queue offsets the record took.
PROPERTY_INNER_MULTI_QUEUE_OFFSET: Final = "INNER_MULTI_QUEUE_OFFSET"
LMQ_PREFIX: Final = "%LMQ%"
# ConsumeQueueExt.MAX_ADDR: tagsCode at or below it is an address into consumequeue_ext/.
_EXT_MAX_ADDR: Final = -(1 << 31) - 1
# DLedgerEntry: magic, size, index, term, pos, channel, chainCrc, bodyCrc, bodySize; the body
# (the RocketMQ record) at BODY_OFFSET.
_DLEDGER_HEAD: Final = struct.Struct(">iiqqqiiii")
_DLEDGER_BODY_OFFSET: Final = 48
_RECORD_MAGICS: Final = (-626843481, -626843477)  # codec.MESSAGE_MAGIC_CODE, _V2
# Directories of RocketMQ 5.x features mqstore leaves alone (they hold no message of their own a
# queue here needs): named by `inspect`, not refused.
_OTHER_LAYOUT_NAMES: Final = ("consumequeue_rocksdb", "timerlog", "timerwheel", "compaction")
_LMQ_SAMPLE_QUEUES: Final = 16
_MAX_TOPIC_BYTES: Final = 127  # codec.MAX_TOPIC_BYTES (codec imports this module)
_TOPIC_CHARACTERS: Final = frozenset("%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

SUPPORTED: Final = (
    "mqstore reads RocketMQ 4.x stores without multi-dispatch (LMQ), ConsumeQueueExt, batch consume queues "
    "or DLedger, and changes nothing in one that uses them: serve it with the RocketMQ broker that wrote it"
)


class ForeignStoreError(StoreDirectoryError):
    """The store uses a RocketMQ feature mqstore does not implement (see the module doc)."""


def record_feature(sys_flag: int, properties: Mapping[str, str] | None, topic: str = "") -> str | None:
    """The feature a commitlog record was written with that mqstore does not implement, or None.
    `topic`, where the caller decoded it: a topic longer than 4.x's 127 bytes (5.x writes it in
    a V2 record) names a queue mqstore cannot keep (its directory is not a topic's name here)."""
    if len(topic) > _MAX_TOPIC_BYTES // 4 and len(topic.encode("utf-8")) > _MAX_TOPIC_BYTES:
        return (f"a record of a topic {len(topic.encode('utf-8'))} bytes long (RocketMQ 5.x's V2 format; 4.x topics "
                f"are at most {_MAX_TOPIC_BYTES} bytes)")  # fmt: skip
    if sys_flag & INNER_BATCH_FLAG:
        return "an INNER_BATCH record (sysflag 0x80: a batch consume queue's messages in one body)"
    if sys_flag & NEED_UNWRAP_FLAG:
        return "a NEED_UNWRAP record (sysflag 0x40: messages wrapped in one body)"
    if properties is not None and _multi_dispatched(properties):
        queues = properties[PROPERTY_INNER_MULTI_DISPATCH]
        return f"a multi-dispatch (LMQ) record (INNER_MULTI_DISPATCH={queues[:80]!r})"
    return None


def _multi_dispatched(properties: Mapping[str, str]) -> bool:
    """Whether a broker multi-dispatched the record: it wrote INNER_MULTI_QUEUE_OFFSET as one
    queue offset per queue INNER_MULTI_DISPATCH names (MultiDispatch.wrapMultiDispatch). A record
    with either name alone or in another shape is an ordinary message whose producer chose those
    names (review 64 F1: mqstore before efcece4 and RocketMQ 4.4.0 stored them as any other
    property, and refusing such a store would leave no way on)."""
    offsets = properties.get(PROPERTY_INNER_MULTI_QUEUE_OFFSET)
    queues = properties.get(PROPERTY_INNER_MULTI_DISPATCH)
    if not offsets or not queues:
        return False
    names, numbers = queues.split(","), offsets.split(",")
    return len(names) == len(numbers) and all(names) and all(n.isdigit() and n.isascii() for n in numbers)


def refuse_record(commitlog_offset: int, topic: str, feature: str) -> ForeignStoreError:
    """The refusal for a record `record_feature` named (raised by the caller)."""
    return ForeignStoreError(f"the commitlog record at offset {commitlog_offset} (topic {topic!r}) is {feature}; "
                             f"{SUPPORTED}")  # fmt: skip


def is_ext_address(tags_code: int) -> bool:
    """Whether a ConsumeQueue unit's tagsCode is a ConsumeQueueExt address, not a tag hash."""
    return tags_code <= _EXT_MAX_ADDR


def _holds_files(fs: FileSystem, directory: str) -> bool:
    """Whether any regular file lies under `directory` (walked without following links)."""
    if not fs.isdir(directory):
        return False
    for name in fs.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.islink(path):
            continue
        if fs.isfile(path) or (fs.isdir(path) and _holds_files(fs, path)):
            return True
    return False


def _segments(fs: FileSystem, directory: str) -> dict[int, str]:
    if not fs.isdir(directory):
        return {}
    return {int(n): os.path.join(directory, n) for n in fs.listdir(directory) if len(n) == 20 and n.isdigit()}


def _dledger_entry_at_start(fs: FileSystem, path: str, file_start: int) -> bool:
    """Whether the file begins with a DLedger entry: its size is the header plus its body, its
    pos is the file's own offset, and a RocketMQ record of the body's size follows the header."""
    try:
        data = fs.read_at(path, 0, _DLEDGER_BODY_OFFSET + 8)
    except OSError:
        return False
    if len(data) < _DLEDGER_BODY_OFFSET + 8:
        return False
    _magic, size, _index, _term, pos, _channel, _chain, _crc, body_size = _DLEDGER_HEAD.unpack_from(data)
    total, magic = struct.unpack_from(">ii", data, _DLEDGER_BODY_OFFSET)
    return body_size > 0 and size == _DLEDGER_BODY_OFFSET + body_size and pos == file_start and (
        magic in _RECORD_MAGICS and total == body_size
    )  # fmt: skip


def _lmq_queue_foreign(cfg: StoreConfig, fs: FileSystem, topic: str, segments: Mapping[int, str]) -> str | None:
    """Why the `%LMQ%` topic directory holds multi-dispatch units, or None: its first unit points
    at a whole record of another topic, or at one a broker multi-dispatched. (mqstore lets a
    put name a topic `%LMQ%...`, as RocketMQ 4.4 does: such a queue's units point at its own.)"""
    from . import codec  # (codec imports this module)

    topic_dir = os.path.join(cfg.consume_queue_dir, topic)
    for queue in sorted(fs.listdir(topic_dir)):
        files = sorted(n for n in fs.listdir(os.path.join(topic_dir, queue)) if n.isdigit()) if queue.isdigit() else []
        if not files or not segments:
            continue
        try:
            unit = fs.read_at(os.path.join(topic_dir, queue, files[0]), 0, codec.CQ_STORE_UNIT_SIZE)
        except OSError:
            continue
        if len(unit) < codec.CQ_STORE_UNIT_SIZE:
            continue
        offset, size, _tags = codec.CQ_UNIT.unpack(unit)
        starts = [s for s in segments if s <= offset]
        if not starts or not 0 < size <= cfg.max_stored_record_bytes:
            continue
        start = max(starts)
        try:
            data = fs.read_at(segments[start], offset - start, size)
        except OSError:
            continue
        read = codec.read_record(data, 0, len(data), read_body=False, max_message_size=cfg.max_stored_record_bytes)
        record = read.record
        if record is None or record.commitlog_offset != offset:
            continue  # cleaned, zeroed or damaged: no evidence either way
        if record.topic != topic or _multi_dispatched(record.properties):
            return f"its units point at records of topic {record.topic!r} (offset {offset})"
    return None


def foreign_layout(cfg: StoreConfig, fs: FileSystem) -> list[str]:
    """What in the store's directories says it was written with a feature mqstore does not
    implement, one line each (empty: none). A few listings and small reads: cheap at every open."""
    found: list[str] = []
    root = cfg.root_dir
    for directory, feature in ((cfg.consume_queue_ext_dir, "ConsumeQueueExt (enableConsumeQueueExt)"),
                               (os.path.join(root, "batchconsumequeue"), "batch consume queues (queue.type=BatchCQ)")):  # fmt: skip
        if _holds_files(fs, directory):
            found.append(f"{directory} holds files: the store was written with {feature}")
    if fs.isdir(root):
        for name in sorted(fs.listdir(root)):
            data = os.path.join(root, name, "data")
            if name.startswith("dledger-") and _segments(fs, data):
                found.append(f"{data} holds a DLedger commitlog: the store was written in DLedger mode")
    segments = _segments(fs, cfg.commitlog_dir)
    for start in sorted(segments)[:1] + sorted(segments)[-1:]:
        if _dledger_entry_at_start(fs, segments[start], start):
            found.append(f"{segments[start]} begins with a DLedger entry header, not a commitlog record: a DLedger "
                         "log (dledger-<id>/data) taken for a commitlog")  # fmt: skip
            break
    lmq: list[str] = []
    if fs.isdir(cfg.consume_queue_dir):
        names = fs.listdir(cfg.consume_queue_dir)
        lmq = sorted(n for n in names if n.startswith(LMQ_PREFIX))
        long_topics = sorted(n for n in names if len(n.encode("utf-8")) > _MAX_TOPIC_BYTES and set(n) <= _TOPIC_CHARACTERS)
        if long_topics:
            # Skipped as "not a topic" by the queue listing, its queue read as empty: 5.x writes
            # topics past 127 bytes in V2 records (review 61 M1).
            found.append(f"the ConsumeQueue directory {os.path.join(cfg.consume_queue_dir, long_topics[0])} is named "
                         f"as a topic {len(long_topics[0].encode('utf-8'))} bytes long: RocketMQ 5.x's V2 records; "
                         f"4.x topics are at most {_MAX_TOPIC_BYTES} bytes")  # fmt: skip
    for topic in lmq[:_LMQ_SAMPLE_QUEUES]:
        why = _lmq_queue_foreign(cfg, fs, topic, segments)
        if why is not None:
            found.append(f"the ConsumeQueue {os.path.join(cfg.consume_queue_dir, topic)} is a multi-dispatch (LMQ) "
                         f"queue: {why}")  # fmt: skip
            break
    return found


def refuse_foreign_layout(cfg: StoreConfig, fs: FileSystem) -> None:
    """ForeignStoreError naming what `foreign_layout` found; nothing is changed either way."""
    found = foreign_layout(cfg, fs)
    if found:
        raise ForeignStoreError(f"{'; '.join(found)}. {SUPPORTED}")


def other_layout_directories(cfg: StoreConfig, fs: FileSystem) -> list[str]:
    """Directories of the store root written by other RocketMQ versions or modes that mqstore
    leaves alone (a rocksdb consume queue store, timer, compaction): for `inspect` to name."""
    root = cfg.root_dir
    return [os.path.join(root, n) for n in _OTHER_LAYOUT_NAMES if fs.exists(os.path.join(root, n))]
