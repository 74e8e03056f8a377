"""Cut only torn tails (issue 19): a damaged commitlog record with valid records after it is
quarantined (left in place, reported, skipped), never a reason to cut what follows."""

from __future__ import annotations

import os
from typing import Any

import pytest

import mqstore
from mqstore.storage.status import GetMessageStatus
from mqstore.tools.verify import verify_store

SEG = 64 * 1024
SETTINGS: dict[str, Any] = dict(mapped_file_size_commitlog_bytes=SEG, mapped_file_size_consume_queue_bytes=20 * 200)
TOPIC = "q"


def _body(i: int) -> bytes:
    return b"%05d" % i * 20


def _fill(store_dir: str, n: int) -> list[int]:
    """Put n messages in one queue; their commitlog offsets."""
    offsets = []
    with mqstore.open(store_dir, **SETTINGS) as store:
        for i in range(n):
            r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=_body(i), keys=[f"k{i}"]))
            assert r.status is mqstore.PutMessageStatus.PUT_OK
            offsets.append(r.commitlog_offset)
    return offsets


def _flip_body_byte(store_dir: str, record_offset: int, body: bytes) -> int:
    seg = os.path.join(store_dir, "commitlog", "%020d" % (record_offset - record_offset % SEG))
    with open(seg, "r+b") as f:
        f.seek(record_offset % SEG)
        record = f.read(400)
        at = record_offset % SEG + record.index(body) + 3
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    return record_offset - record_offset % SEG + at


def _all_bodies(store: mqstore.MessageStore) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    offset = 0
    end = store.max_offset(TOPIC, 0)
    while offset < end:
        r = store.get(TOPIC, 0, offset, 64)
        if r.status is not GetMessageStatus.FOUND:
            break
        for m in r.messages:
            got[m.queue_offset] = m.body
        offset = r.next_begin_offset
    return got


@pytest.mark.parametrize("aborted", [False, True])
def test_one_flipped_body_byte_loses_nothing_after_it(tmp_path: object, aborted: bool) -> None:
    """The issue's repro: put 200, close cleanly, flip one body byte of message 3, reopen.
    Before: recovery cut the log at message 3 and max_offset was 3."""
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill(store_dir, 200)
    _flip_body_byte(store_dir, offsets[3], _body(3))
    if aborted:
        open(os.path.join(store_dir, "abort"), "w").close()
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None
        assert rec.max_offset == offsets[-1] + (offsets[-1] - offsets[-2]), rec.summary()
        assert [(q.start, q.end) for q in rec.quarantined] == [(offsets[3], offsets[4])], rec.summary()
        assert store.max_offset(TOPIC, 0) == 200
        bodies = _all_bodies(store)
        for i in range(200):
            if i != 3:
                assert bodies.get(i) == _body(i), i
        # New puts go after the last record, not over anything.
        r = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"new"))
        assert r.status is mqstore.PutMessageStatus.PUT_OK and r.queue_offset == 200, r
        assert r.commitlog_offset == rec.max_offset
    report = verify_store(store_dir, config=mqstore.StoreConfig(**SETTINGS))
    damaged = [p for p in report.problems if p.kind == "commitlog_damaged"]
    assert [p.where for p in damaged] == [f"offset {offsets[3]}"], [str(p) for p in report.problems]


def test_a_zeroed_range_in_the_middle_is_quarantined_not_cut(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill(store_dir, 200)
    seg = os.path.join(store_dir, "commitlog", "%020d" % 0)
    with open(seg, "r+b") as f:  # records 10..12 zeroed, header and all
        f.seek(offsets[10])
        f.write(b"\0" * (offsets[13] - offsets[10]))
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None
        assert [(q.start, q.end) for q in rec.quarantined] == [(offsets[10], offsets[13])], rec.summary()
        bodies = _all_bodies(store)
        assert all(bodies.get(i) == _body(i) for i in range(13, 200)), sorted(set(range(200)) - set(bodies))


def test_a_torn_tail_is_still_cut(tmp_path: object) -> None:
    store_dir = os.path.join(str(tmp_path), "s")
    offsets = _fill(store_dir, 50)
    _flip_body_byte(store_dir, offsets[49], _body(49))
    open(os.path.join(store_dir, "abort"), "w").close()
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None and rec.max_offset == offsets[49] and not rec.quarantined, rec.summary()
    assert verify_store(store_dir, config=mqstore.StoreConfig(**SETTINGS)).ok
