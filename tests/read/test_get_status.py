"""store.get (spec §13.1): every GetMessageStatus produced on purpose, with its next begin offset."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import pytest

import mqstore
from mqstore import GetMessageStatus as S
from mqstore import Message, MessageStore
from mqstore import reads
from mqstore.storage import codec
from mqstore.storage.commitlog import CommitLogReader

h = sys.modules["mqstore_read_test_helpers"]  # loaded by conftest.py
UNIT, cq_dir, put_n = h.UNIT, h.cq_dir, h.put_n

Open = Callable[..., MessageStore]
TINY_CQ = {"mapped_file_size_consume_queue_bytes": 4 * UNIT}  # 4 units per ConsumeQueue file


def offsets(result) -> list[int]:  # type: ignore[no-untyped-def]
    return [m.queue_offset for m in result.messages]


def test_found_returns_the_messages_and_next_begin_offset_is_offset_plus_units_scanned(open_store: Open) -> None:
    store = open_store()
    put_n(store, 10)
    r = store.get("T", 0, 3, 4)
    assert r.status is S.FOUND and offsets(r) == [3, 4, 5, 6]
    assert (r.next_begin_offset, r.min_offset, r.max_offset) == (7, 0, 10)
    assert [m.body for m in r.messages] == [b"x" * 100] * 4
    raw = store.get("T", 0, 3, 4, raw=True)
    assert raw.status is S.FOUND and not raw.messages and len(raw.raw) == 4
    assert [codec.read_record(b, 0).record.queue_offset for b in raw.raw] == [3, 4, 5, 6]


def test_unknown_queue_is_no_message_in_queue_and_moves_the_consumer_to_zero(open_store: Open) -> None:
    store = open_store()
    put_n(store, 3)
    for topic, queue_id in (("T", 1), ("nope", 0)):
        r = store.get(topic, queue_id, 5, 32)  # the empty check comes first, whatever the offset
        assert (r.status, r.next_begin_offset, r.messages) == (S.NO_MESSAGE_IN_QUEUE, 0, ())


def test_offset_at_max_is_overflow_one_and_the_consumer_stays(open_store: Open) -> None:
    store = open_store()
    put_n(store, 5)
    r = store.get("T", 0, 5, 32)
    assert (r.status, r.next_begin_offset, r.max_offset) == (S.OFFSET_OVERFLOW_ONE, 5, 5)


def test_offset_past_max_is_overflow_badly_and_restarts_at_zero_when_min_is_zero(open_store: Open) -> None:
    store = open_store()
    put_n(store, 5)
    r = store.get("T", 0, 6, 32)
    assert (r.status, r.next_begin_offset) == (S.OFFSET_OVERFLOW_BADLY, 0)


def test_offset_below_min_after_early_queue_files_are_removed_is_too_small(tmp_path: Path, open_store: Open) -> None:
    root = tmp_path / "store"
    store = open_store(root, **TINY_CQ)
    put_n(store, 12)  # ConsumeQueue files 0, 80, 160
    assert store.close()
    os.remove(cq_dir(root) / "00000000000000000000")
    # Without the queue ledger (a broker's store) a missing first file reads as the cleaner's
    # work; with it, the open would rebuild the file (tests/crash/test_derived_files_rebuilt.py).
    os.remove(root / "queue_ledger.msgpack")
    store = open_store(root, **TINY_CQ)
    r = store.get("T", 0, 1, 32)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (S.OFFSET_TOO_SMALL, 4, 4, 12)
    # With min > 0, an offset past max moves the consumer to max, not to 0.
    r = store.get("T", 0, 13, 32)
    assert (r.status, r.next_begin_offset) == (S.OFFSET_OVERFLOW_BADLY, 12)
    r = store.get("T", 0, 4, 32)  # one ConsumeQueue file per get
    assert (r.status, offsets(r), r.next_begin_offset) == (S.FOUND, [4, 5, 6, 7], 8)


def test_a_queue_file_gone_between_two_others_is_rebuilt_at_open(tmp_path: Path, open_store: Open) -> None:
    """RocketMQ reads such a gap as OFFSET_FOUND_NULL and the consumer skips to the next file;
    the open cuts the queue at the gap and rebuilds it from the log instead. (A file missing
    under a running store still reads OFFSET_FOUND_NULL: tests/read/test_reads.py.)"""
    root = tmp_path / "store"
    store = open_store(root, **TINY_CQ)
    put_n(store, 12)
    assert store.close()
    os.remove(cq_dir(root) / "00000000000000000080")  # units 4..7
    store = open_store(root, **TINY_CQ)
    r = store.get("T", 0, 5, 32)
    assert (r.status, offsets(r), r.min_offset, r.max_offset) == (S.FOUND, [5, 6, 7], 0, 12)
    assert offsets(store.get("T", 0, 8, 32)) == [8, 9, 10, 11]


def test_tag_filter_matching_nothing_is_no_matched_message_past_the_scanned_units(open_store: Open) -> None:
    store = open_store()
    put_n(store, 10, tags=lambda i: "TagB")
    r = store.get("T", 0, 2, 32, tags="TagA")
    assert (r.status, r.messages, r.next_begin_offset) == (S.NO_MATCHED_MESSAGE, (), 10)
    assert offsets(store.get("T", 0, 2, 32, tags="TagA||TagB")) == list(range(2, 10))
    assert offsets(store.get("T", 0, 2, 32, tags="*")) == list(range(2, 10))


def test_tags_with_colliding_java_hash_codes_never_deliver_the_other_tag(open_store: Open) -> None:
    assert codec.java_string_hash("Aa") == codec.java_string_hash("BB") == 2112
    store = open_store()
    put_n(store, 10, tags=lambda i: "Aa" if i % 2 else "BB")
    r = store.get("T", 0, 0, 32, tags="Aa")
    assert r.status is S.FOUND and offsets(r) == [1, 3, 5, 7, 9] and {m.tags for m in r.messages} == {"Aa"}
    assert r.next_begin_offset == 10
    raw = store.get("T", 0, 0, 32, tags="Aa", raw=True)
    assert [codec.read_record(b, 0).record.tags for b in raw.raw] == ["Aa"] * 5
    # Only collisions in range: the tag hash matches every unit, the real tag none.
    r = store.get("T", 0, 9, 32, tags="BB")
    assert (r.status, r.next_begin_offset) == (S.NO_MATCHED_MESSAGE, 10)


def test_units_whose_commitlog_segment_was_deleted_are_message_was_removing(tmp_path: Path, open_store: Open) -> None:
    """What a reader sees between the cleaner deleting a CommitLog segment and the queues'
    min offsets catching up: a status, never an exception."""
    root = tmp_path / "store"
    store = open_store(root, mapped_file_size_commitlog_bytes=4096, **TINY_CQ)
    results = []
    while not results or results[-1].commitlog_offset < 4096:
        results += put_n(store, 1)
    results += put_n(store, 3)
    first_kept = next(r.queue_offset for r in results if r.commitlog_offset >= 4096)
    assert first_kept >= 8
    os.remove(root / "commitlog" / "00000000000000000000")  # as the cleaner does
    r = store.get("T", 0, 0, 32)
    assert (r.status, r.messages, r.next_begin_offset) == (S.MESSAGE_WAS_REMOVING, (), 4)
    # The scan skips the rest of the deleted segment and returns what the next one holds.
    start = first_kept - first_kept % 4
    r = store.get("T", 0, start, 32)
    assert r.status is S.FOUND and offsets(r)[0] == first_kept and r.next_begin_offset == start + 4
    assert store.lookup(0) is None


def test_a_map_closed_between_finding_and_decoding_reads_as_removed(
    open_store: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    """get/lookup decode in place in the reader's map; a close racing them (store closing,
    segment removed) reads as the segment being removed, never as an exception."""
    import mmap

    store = open_store()
    put_n(store, 3)
    closed = mmap.mmap(-1, 4096)
    closed.close()
    monkeypatch.setattr(CommitLogReader, "select", lambda self, offset, size: (closed, 0))
    r = store.get("T", 0, 0, 32)
    assert (r.status, r.messages) == (S.MESSAGE_WAS_REMOVING, ())
    assert store.lookup(0) is None
    # Other errors are not hidden.
    monkeypatch.setattr(CommitLogReader, "select", lambda self, offset, size: (b"\0" * 8, -9))
    monkeypatch.setattr(codec, "read_served", _raise_value_error)
    with pytest.raises(ValueError, match="not a closed map"):
        store.lookup(0)


def _raise_value_error(*args: object, **kwargs: object) -> None:
    raise ValueError("not a closed map")


def test_no_matched_logic_queue_when_the_consume_queue_service_cannot_answer(open_store: Open) -> None:
    """4.4.0 never returns it (queues are created on demand); we do when the ConsumeQueue actor
    is down (between its crash and its restart) for longer than read_your_writes_timeout_ms.
    The offset is kept. After close() every call raises StoreClosedError."""
    store = open_store(read_your_writes_timeout_ms=50)
    put_n(store, 3)
    store.supervisor.peers["consume_queue"].stop()  # the state between a crash and its restart
    r = store.get("T", 0, 2, 32)
    assert (r.status, r.next_begin_offset, r.messages) == (S.NO_MATCHED_LOGIC_QUEUE, 2, ())
    assert r.detail
    store.close()
    with pytest.raises(mqstore.StoreClosedError):
        store.get("T", 0, 1, 32)


def test_a_batch_stops_at_max_count_and_at_32_messages_in_memory(open_store: Open) -> None:
    store = open_store()
    put_n(store, 40)
    assert offsets(store.get("T", 0, 0, 5)) == [0, 1, 2, 3, 4]
    r = store.get("T", 0, 0, 100)
    assert offsets(r) == list(range(32)) and r.next_begin_offset == 32


def test_a_batch_stops_before_256_kib_in_memory_but_always_returns_one(open_store: Open) -> None:
    store = open_store()
    put_n(store, 4, body=b"y" * 100_000)
    r = store.get("T", 0, 0, 32)
    assert offsets(r) == [0, 1] and r.next_begin_offset == 2  # a third would pass 256 KiB
    r = store.get("T", 0, 0, 32, max_total_bytes=10)
    assert offsets(r) == [0] and r.next_begin_offset == 1


def test_messages_far_behind_the_head_count_as_in_disk_and_cap_at_8(
    open_store: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store()
    put_n(store, 20)
    monkeypatch.setattr(reads, "_TOTAL_RAM_BYTES", 1)  # everything is "not in the page cache"
    r = store.get("T", 0, 0, 32)
    assert offsets(r) == list(range(8)) and r.next_begin_offset == 8


def test_put_through_the_store_actor_and_get_back(open_store: Open) -> None:
    import pykka

    from mqstore.messages import Get, Reply

    store = open_store()
    put_n(store, 2, tags=lambda i: "A")
    future: pykka.ThreadingFuture = pykka.ThreadingFuture()
    store.actor_ref.tell(Get(topic="T", queue_id=0, offset=0, max_count=32, tags="A", reply=Reply(future=future)))
    assert offsets(future.get(timeout=10)) == [0, 1]


def test_message_record_topic_matches(open_store: Open) -> None:
    store = open_store()
    store.put(Message(topic="Other", body=b"z"))
    put_n(store, 1)
    assert [m.topic for m in store.get("T", 0, 0, 32).messages] == ["T"]


def test_after_a_restart_units_into_a_deleted_first_segment_are_message_was_removing(
    tmp_path: Path, open_store: Open
) -> None:
    """correctMinOffset at start scans only the first ConsumeQueue file; when all its units
    point into the deleted segment the min offset stays, and reading there gives a status."""
    root = tmp_path / "store"
    settings = {"mapped_file_size_commitlog_bytes": 4096, **TINY_CQ}
    store = open_store(root, **settings)
    results = []
    while not results or results[-1].commitlog_offset < 4096:
        results += put_n(store, 1)
    assert store.close()
    os.remove(root / "commitlog" / "00000000000000000000")
    store = open_store(root, **settings)
    r = store.get("T", 0, 0, 32)
    assert (r.status, r.next_begin_offset, r.min_offset) == (S.MESSAGE_WAS_REMOVING, 4, 0)
    last = results[-1].queue_offset
    assert offsets(store.get("T", 0, last, 32)) == [last]
