"""Layouts no mqstore (nor a 4.4.0 broker) writes but a copied, foreign or damaged store may
hold (review 120): recovery keeps every valid record and gives no queue offset twice."""

from __future__ import annotations

import os
import shutil
import struct

import pytest

import mqstore
from mqstore.cli import main as cli_main
from mqstore.storage import codec
from mqstore.storage.status import GetMessageStatus
from mqstore.tools.verify import verify_store

SEG = 16 * 1024
SETTINGS = dict(mapped_file_size_commitlog_bytes=SEG, mapped_file_size_consume_queue_bytes=20 * 200)
TOPIC = "f"


def _bodies(store: mqstore.MessageStore, queue_id: int) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    offset, end = 0, store.max_offset(TOPIC, queue_id)
    while offset < end:
        r = store.get(TOPIC, queue_id, offset, 32)
        assert r.status is GetMessageStatus.FOUND, (offset, r.status, r.detail)
        got.update((m.queue_offset, m.body) for m in r.messages)
        offset = r.next_begin_offset
    return got


def _drop_derived_files(store_dir: str) -> None:
    """Queues, index and mqstore's own ledgers gone: the log alone, as a broker's copied commitlog."""
    for name in ("consumequeue", "index"):
        shutil.rmtree(os.path.join(store_dir, name), ignore_errors=True)
    for name in ("queue_ledger.msgpack", "index_progress.msgpack"):
        if os.path.exists(os.path.join(store_dir, name)):
            os.remove(os.path.join(store_dir, name))


@pytest.mark.parametrize("aborted", [True, False])
def test_a_segment_its_records_fill_exactly_is_no_end_of_the_log(
    tmp_path: object, aborted: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review 120 F1: a segment whose records end exactly at its end (no blank record: the
    writers keep 8 bytes for one, a foreign or copied store need not) ended the scan there:
    after a crash recovery zeroed the next segment and deleted every later one, all their
    records valid (334 of 400 lost in the review's store)."""
    store_dir = os.path.join(str(tmp_path), "s")
    with mqstore.open(store_dir, **SETTINGS) as store:
        for i in range(120):
            assert store.put(mqstore.Message(topic=TOPIC, body=b"%04d" % i * 25)).ok
    first = os.path.join(store_dir, "commitlog", "%020d" % 0)
    with open(first, "rb") as f:
        data = bytearray(f.read())
    # The segment's last record grown by the blank's bytes: it ends at the segment's end.
    pos, last = 0, None
    while True:
        read = codec.read_record(data, pos, SEG)
        if read.kind is not codec.RecordKind.MESSAGE:
            break
        last, pos = (pos, read.record), pos + read.size
    assert last is not None and 8 <= SEG - pos < 200
    at, record = last
    grown = record._replace(body=record.body + b"+" * (SEG - pos))
    encoded = codec.encode_record(grown)
    assert at + len(encoded) == SEG
    data[at:] = encoded
    with open(first, "r+b") as f:
        f.write(data)
    _drop_derived_files(store_dir)
    if aborted:
        open(os.path.join(store_dir, "abort"), "w").close()
    before = sorted(os.listdir(os.path.join(store_dir, "commitlog")))
    # The read-only tools walk on as recovery does (review 121 F1: inspect said "damaged", and
    # dump exited 3 after the first segment's records).
    capsys.readouterr()
    assert cli_main(["dump", store_dir]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 120
    assert cli_main(["inspect", store_dir]) == 0
    assert "full" in capsys.readouterr().out
    with mqstore.open(store_dir, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None and rec.truncated_commitlog_bytes == 0 and not rec.removed_commitlog_files, rec.summary()
        bodies = _bodies(store, 0)
        assert len(bodies) == 120
        assert bodies[record.queue_offset] == grown.body
        assert all(bodies[i] == b"%04d" % i * 25 for i in range(120) if i != record.queue_offset)
        put = store.put(mqstore.Message(topic=TOPIC, body=b"next"))
        assert put.ok and put.queue_offset == 120
    assert sorted(os.listdir(os.path.join(store_dir, "commitlog"))) == before
    assert verify_store(store_dir).ok


def test_a_torn_last_unit_of_a_queue_without_a_ledger_is_rebuilt_from_the_log(tmp_path: object) -> None:
    """Review 120 F2: a store with no queue ledger (a broker's), stopped cleanly, one queue's
    last unit half written (its commitlog offset there, size and tags code zeros): the open
    dropped the unit and, the queues' highest unit being another queue's, never dispatched its
    record again; the next put to that queue was given its queue offset (two records claiming
    it, the first unreadable by queue)."""
    store_dir = os.path.join(str(tmp_path), "s")
    with mqstore.open(store_dir, **SETTINGS) as store:
        for i in range(60):
            assert store.put(mqstore.Message(topic=TOPIC, queue_id=i % 2, body=b"m%03d" % i)).ok
    os.remove(os.path.join(store_dir, "queue_ledger.msgpack"))
    cq = os.path.join(store_dir, "consumequeue", TOPIC, "0", "%020d" % 0)
    last_unit = 29 * codec.CQ_STORE_UNIT_SIZE  # queue 0's 30th message, the 59th of the log
    with open(cq, "r+b") as f:
        f.seek(last_unit + 8)
        f.write(struct.pack(">iq", 0, 0))
    with mqstore.open(store_dir, **SETTINGS) as store:
        bodies = _bodies(store, 0)
        assert bodies == {i: b"m%03d" % (2 * i) for i in range(30)}
        put = store.put(mqstore.Message(topic=TOPIC, queue_id=0, body=b"after"))
        assert put.ok and put.queue_offset == 30, put
    report = verify_store(store_dir)
    assert report.ok, [str(p) for p in report.problems]
