"""After a crash, the ConsumeQueue units past the re-dispatch start stay where each is exactly
the unit dispatch writes for the record it points at; a queue is cut at its first unit that
is not, and re-dispatch writes the rest again.

Review 46 M4: every unit past the start was cut, so after kill -9 on a full disk (nothing can
be written back) every acknowledged message read as missing until space returned."""

from __future__ import annotations

import pytest

import mqstore
from mqstore.storage.codec import CQ_STORE_UNIT_SIZE, CQ_UNIT, tags_code
from mqstore.storage.consume_queue import FILLER_UNIT
from mqstore.storage.fs import SimulatedFileSystem

from crashlib import assert_verified

ROOT = "/sim/store"
SETTINGS = dict(
    mapped_file_size_commitlog_bytes=256 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=64,
    max_index_num=400,
    read_your_writes_timeout_ms=300,
)
QUEUES = 4
PER_QUEUE = 300  # two ConsumeQueue files each


def _queue_file(queue_id: int, queue_offset: int) -> tuple[str, int]:
    file_bytes = SETTINGS["mapped_file_size_consume_queue_bytes"]
    start = queue_offset * CQ_STORE_UNIT_SIZE // file_bytes * file_bytes
    return f"{ROOT}/consumequeue/T/{queue_id}/{start:020d}", queue_offset * CQ_STORE_UNIT_SIZE - start


def _killed_store(*, capacity_bytes: int | None = None) -> SimulatedFileSystem:
    """The disk after kill -9 of a store that put PER_QUEUE messages to each queue: every byte
    written (the page cache survives a process), the abort marker left, and a checkpoint that
    records no flush, so that re-dispatch starts at the log's first record and every unit is
    past it."""
    fs = SimulatedFileSystem(capacity_bytes=capacity_bytes)
    fs.makedirs("/sim")
    store = mqstore.open(ROOT, fs=fs, **SETTINGS)
    for i in range(PER_QUEUE * QUEUES):
        message = mqstore.Message(topic="T", queue_id=i % QUEUES, body=b"b" * 200, keys=[f"k{i}"],
                                  tags="even" if i % 2 == 0 else "odd")  # fmt: skip
        assert store.put(message).ok
    assert store.get("T", QUEUES - 1, PER_QUEUE - 1, 1).messages  # dispatched
    killed = fs.crash(0, tear=False)
    with fs._lock:
        for path, file in fs._files.items():
            killed._files[path].volatile[:] = file.volatile
            killed._files[path].durable[:] = file.volatile
    store.close()
    killed.write_atomic(ROOT + "/abort", b"")
    killed.write_atomic(ROOT + "/checkpoint", bytes(4096))
    return killed


def _keys(store: mqstore.MessageStore, queue_id: int, *, tags: str | None = None) -> list[str]:
    keys: list[str] = []
    offset = 0
    while offset < PER_QUEUE:
        got = store.get("T", queue_id, offset, 64, tags=tags)
        assert got.status in (mqstore.GetMessageStatus.FOUND, mqstore.GetMessageStatus.NO_MATCHED_MESSAGE), got
        keys += [m.key_list[0] for m in got.messages]
        offset = got.next_begin_offset
    return keys


def _expected(queue_id: int, parity: int | None = None) -> list[str]:
    return [f"k{i}" for i in range(queue_id, PER_QUEUE * QUEUES, QUEUES) if parity is None or i % 2 == parity]


def test_after_kill_9_on_a_full_disk_every_acknowledged_message_is_served_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mqstore import supervisor

    monkeypatch.setattr(supervisor, "DISPATCH_CATCH_UP_TIMEOUT_MS", 300)  # the index waits for blocks
    fs = _killed_store(capacity_bytes=8 * 1024 * 1024)
    fs.write_atomic("/sim/filler", bytes(fs.free_bytes()))
    with mqstore.open(ROOT, fs=fs, **SETTINGS) as store:
        rec = store.supervisor.recovery
        assert rec is not None and not rec.last_exit_ok
        for queue_id in range(QUEUES):
            assert store.max_offset("T", queue_id) == PER_QUEUE
            assert _keys(store, queue_id) == _expected(queue_id)
        refused = store.put(mqstore.Message(topic="T", body=b"x"))
        assert refused.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE and "disk full" in refused.detail
    fs.assert_no_sigbus()


@pytest.mark.parametrize("damage", ["tags code", "size", "commitlog offset", "filler", "zeros"])
def test_a_queue_is_cut_at_its_first_unit_that_does_not_match_the_log(damage: str) -> None:
    """Queue 1's unit at queue offset 250 (its second file) no longer says what its record
    does: it and every later unit of that queue are written again from the log, at their
    offsets; the other queues and the units before it are served as they were."""
    fs = _killed_store()
    path, pos = _queue_file(1, 250)
    offset, size, code = CQ_UNIT.unpack(fs.read_at(path, pos, CQ_STORE_UNIT_SIZE))
    assert code in (tags_code("even"), tags_code("odd"))
    unit = {
        "tags code": CQ_UNIT.pack(offset, size, tags_code("even") + tags_code("odd") - code),
        "size": CQ_UNIT.pack(offset, size + 1, code),
        "commitlog offset": CQ_UNIT.pack(offset + size, size, code),  # the next record's place
        "filler": FILLER_UNIT,
        "zeros": bytes(CQ_STORE_UNIT_SIZE),
    }[damage]
    with fs._lock:
        for image in (fs._files[path].volatile, fs._files[path].durable):
            image[pos : pos + CQ_STORE_UNIT_SIZE] = unit
    with mqstore.open(ROOT, fs=fs, **SETTINGS) as store:
        for queue_id in range(QUEUES):
            assert store.max_offset("T", queue_id) == PER_QUEUE
            assert _keys(store, queue_id) == _expected(queue_id)
            # The tags code is the unit's own: a wrong one kept would hide or show the message.
            assert _keys(store, queue_id, tags="odd") == _expected(queue_id, parity=1)
        assert CQ_UNIT.unpack(fs.read_at(path, pos, CQ_STORE_UNIT_SIZE)) == (offset, size, code)
        config = store.config
    assert_verified(ROOT, damage, fs=fs, config=config)
