"""Helpers of the Spark pipeline tests: small commitlogs laid out exactly as a broker lays them out (records never span segments; an END_OF_FILE
blank fills the rest of a segment when record + 8 does not fit)."""

from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from mqstore.storage.codec import (
    TRANSACTION_MASK,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    HostAddress,
    MessageRecord,
    RecordKind,
    blank_record_header,
    encode_message,
    patch_record,
    properties_to_string,
    read_record,
    segment_file_name,
)

FIXTURES = Path("/work/shared/fixtures")
BROKER_SAMPLES = [FIXTURES / "broker-sample-a", FIXTURES / "broker-sample-b"]
SEGMENT_SIZE = 64 * 1024


@dataclass(frozen=True)
class Written:
    """What `write_commitlog` laid out: the store dir and each record's offset."""

    store: Path
    offsets: list[int]
    segment_size: int


def write_commitlog(
    store: Path, specs: list[dict[str, Any]], segment_size: int = SEGMENT_SIZE, start_offset: int = 0
) -> Written:
    """Encode `specs` (encode_message keyword arguments, without offsets) into segments."""
    clog = store / "commitlog"
    clog.mkdir(parents=True, exist_ok=True)
    counters: dict[tuple[str, int], int] = {}
    seg_start, pos = start_offset, 0
    buf = bytearray(segment_size)
    offsets: list[int] = []

    def flush() -> None:
        (clog / segment_file_name(seg_start)).write_bytes(bytes(buf))

    for spec in specs:
        rec = bytearray(encode_message(**spec))
        if len(rec) + 8 > segment_size - pos:
            buf[pos : pos + 8] = blank_record_header(segment_size - pos)
            flush()
            seg_start, pos, buf = seg_start + segment_size, 0, bytearray(segment_size)
        tx = spec.get("sys_flag", 0) & TRANSACTION_MASK
        key = (spec["topic"], spec["queue_id"])
        if tx in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            qoff = counters.get(key, 0)
            counters[key] = qoff + 1
        else:
            qoff = 0  # PREPARED and ROLLBACK do not advance the queue (§3.9)
        patch_record(rec, 0, queue_offset=qoff, commitlog_offset=seg_start + pos, store_timestamp=None)
        buf[pos : pos + len(rec)] = rec
        offsets.append(seg_start + pos)
        pos += len(rec)
    flush()
    return Written(store, offsets, segment_size)


def make_specs(n: int, seed: int = 7, body_size: int = 900) -> list[dict[str, Any]]:
    """A varied mix: topics, queues, tags, multi-token KEYS, UNIQ_KEY, transactions, IPv6
    hosts, a delayed message, empty bodies and property-less records."""
    rnd = random.Random(seed)
    born_v4 = HostAddress("10.0.0.7", 54321)
    store_v4 = HostAddress("192.168.1.10", 10911)
    store_v6 = HostAddress("fe80::1", 10911)
    t0 = 1_700_000_000_000
    specs = []
    for i in range(n):
        topic = rnd.choice(["orders", "payments", "audit-log"])
        props: dict[str, str] = {"UNIQ_KEY": f"{i:032X}", "WAIT": "true"}
        if i % 3:
            props["TAGS"] = rnd.choice(["TagA", "TagB", "payment_success"])
        if i % 4 == 0:
            props["KEYS"] = f"k{i} order-{i % 50}  shared"
        sys_flag = 0
        if i % 97 == 5:
            sys_flag = TRANSACTION_PREPARED_TYPE
        elif i % 97 == 6:
            sys_flag = TRANSACTION_ROLLBACK_TYPE
        elif i % 97 == 7:
            sys_flag = TRANSACTION_COMMIT_TYPE
        queue_id = rnd.randrange(4)
        if i % 211 == 3:
            topic, queue_id = "SCHEDULE_TOPIC_XXXX", 2
            props.update({"DELAY": "3", "REAL_TOPIC": "orders", "REAL_QID": "1"})
        properties = "" if i % 53 == 1 else properties_to_string(props)
        body = b"" if i % 61 == 2 else rnd.randbytes(rnd.randrange(body_size // 2, body_size * 3 // 2))
        specs.append(
            dict(
                topic=topic,
                queue_id=queue_id,
                body=body,
                properties=properties,
                flag=i % 5,
                sys_flag=sys_flag,
                born_timestamp=t0 + i * 997 - 5,
                store_timestamp=t0 + i * 997,
                born_host=born_v4,
                store_host=store_v6 if i % 401 == 17 else store_v4,
                reconsume_times=i % 3,
            )
        )
    return specs


def reference_records(paths: list[Path | str]) -> list[tuple[str, int, MessageRecord]]:
    """(segment path, position, record) by a plain codec.read_record loop, for comparison."""
    from mqstore.pipeline.segments import discover_segments

    out = []
    for seg in discover_segments([str(p) for p in paths]):
        data = Path(seg.path).read_bytes()
        pos = 0
        while pos < len(data):
            got = read_record(data, pos, read_body=True)
            if got.kind is not RecordKind.MESSAGE:
                assert got.kind in (RecordKind.BLANK, RecordKind.END_OF_DATA), got
                break
            assert got.record is not None
            out.append((seg.path, pos, got.record))
            pos += got.size
    return out


def expected_row(path: str, rec: MessageRecord) -> dict[str, Any]:
    """The data source's row for a record, by the codec (timestamps as epoch ms)."""
    return {
        "commitlog_offset": rec.commitlog_offset,
        "size": rec.total_size,
        "topic": rec.topic,
        "queue_id": rec.queue_id,
        "queue_offset": rec.queue_offset,
        "sys_flag": rec.sys_flag,
        "flag": rec.flag,
        "born_timestamp": rec.born_timestamp,
        "store_timestamp": rec.store_timestamp,
        "born_host": str(rec.born_host),
        "store_host": str(rec.store_host),
        "reconsume_times": rec.reconsume_times,
        "tags": rec.tags,
        "keys": rec.keys,
        "properties": dict(rec.properties),
        "body": rec.body,
        "msg_id": rec.msg_id,
        "segment_file": os.path.abspath(path),
        "body_crc": rec.body_crc,
        "prepared_transaction_offset": rec.prepared_transaction_offset,
        "uniq_key": rec.uniq_key,
        "tags_code": rec.tags_code(),
        "error": None,
    }




def returns_promptly(fifo: Path, fn: Callable[[], Any], timeout_s: float = 20) -> tuple[Any, BaseException | None]:
    """(what fn returned, what it raised), failing if it blocked; a blocked open of the FIFO is
    released by opening its other end, so the test never hangs."""
    outcome: list[tuple[Any, BaseException | None]] = []

    def target() -> None:
        try:
            outcome.append((fn(), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append((None, exc))

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        t.join(10)
        os.close(fd)
        pytest.fail(f"blocked on the FIFO {fifo}")
    return outcome[0]


class FrozenTimes:
    """A stat result whose times are those of an earlier stat: what a live segment written
    through a shared mapping shows (the kernel moves mtime/ctime only now and then)."""

    def __init__(self, real: os.stat_result, first: os.stat_result) -> None:
        self._real, self._first = real, first

    def __getattr__(self, name: str) -> Any:
        if name in ("st_mtime", "st_mtime_ns", "st_ctime", "st_ctime_ns"):
            return getattr(self._first, name)
        return getattr(self._real, name)
