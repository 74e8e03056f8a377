"""query across index files with a time filter (§13.2), lookups (§13.3), offsets and times
(§9.5, §13.4) and getCommitLogData (§13.5)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import pytest

from mqstore import Message, MessageStore, QueryResult
from mqstore.storage import codec

h = sys.modules["mqstore_read_test_helpers"]
Open = Callable[..., MessageStore]

ManualClock, T0 = h.ManualClock, h.T0


def put_at(store: MessageStore, clock: ManualClock, ms: int, key: str, body: bytes = b"b") -> int:
    clock.now_ms = ms
    result = store.put(Message(topic="T", body=body, keys=[key]))
    assert result.ok and result.store_timestamp == ms
    return result.queue_offset


def test_query_finds_a_key_across_several_index_files_within_the_time_range(tmp_path: Path, open_store: Open) -> None:
    clock = ManualClock()
    store = open_store(clock_ms=clock, max_index_num=4, max_hash_slot_num=8)
    for i in range(12):  # "k" every second; other keys fill the index files
        put_at(store, clock, T0 + i * 1000, "k" if i % 2 == 0 else f"other{i}")
    assert store.wait_for_messages("T", 0, 11, timeout_s=10)
    everything = store.query("T", "k", 32)
    assert [m.store_timestamp for m in everything.messages] == [T0 + i * 1000 for i in range(0, 12, 2)]
    window = store.query("T", "k", 32, T0 + 3000, T0 + 8000)
    assert [m.store_timestamp for m in window.messages] == [T0 + 4000, T0 + 6000, T0 + 8000]
    assert all(m.key_list == ["k"] and m.topic == "T" for m in window.messages)
    assert store.query("T", "k", 2).messages and len(store.query("T", "k", 2).messages) <= 2
    assert store.query("T", "absent", 32).messages == ()
    assert store.query("Other", "k", 32).messages == ()
    assert len(os.listdir(tmp_path / "store" / "index")) >= 3


def test_lookup_by_msg_id_and_by_offset(open_store: Open) -> None:
    store = open_store()
    results = h.put_n(store, 3)
    record = store.lookup_msg_id(results[1].msg_id)
    assert record is not None and record.queue_offset == 1 and record.commitlog_offset == results[1].commitlog_offset
    assert store.lookup(results[2].commitlog_offset).queue_offset == 2
    other_host = codec.msg_id(codec.HostAddress("10.0.0.9", 10911), results[1].commitlog_offset)
    assert store.lookup_msg_id(other_host) is None
    assert store.lookup(results[2].commitlog_offset + results[2].wrote_bytes) is None


def test_offset_for_time_is_the_exact_or_nearest_message(open_store: Open) -> None:
    clock = ManualClock()
    store = open_store(clock_ms=clock)
    for i in range(10):
        put_at(store, clock, T0 + i * 1000, f"k{i}")
    assert store.wait_for_messages("T", 0, 9, timeout_s=10)
    assert store.offset_for_time("T", 0, T0 + 4000) == 4  # exact
    assert store.offset_for_time("T", 0, T0 + 4300) == 4  # nearer the earlier one
    assert store.offset_for_time("T", 0, T0 + 4700) == 5  # nearer the later one
    assert store.offset_for_time("T", 0, T0 + 4500) == 4  # a tie goes to the earlier one
    assert store.offset_for_time("T", 0, 0) == 0  # before the first: the first
    assert store.offset_for_time("T", 0, T0 + 99_000) == 9  # after the last: the last, not max
    assert store.offset_for_time("T", 1, T0) == 0  # no such queue


def test_earliest_message_time_and_message_store_time(tmp_path: Path, open_store: Open) -> None:
    clock = ManualClock()
    root = tmp_path / "store"
    settings = {"clock_ms": clock, "mapped_file_size_consume_queue_bytes": 4 * h.UNIT, "max_message_size_bytes": 1024}
    store = open_store(root, **settings)
    for i in range(12):
        put_at(store, clock, T0 + i * 1000, f"k{i}", body=b"z" * 100)
    assert store.wait_for_messages("T", 0, 11, timeout_s=10)
    assert store.earliest_message_time("T", 0) == T0
    assert store.message_store_time("T", 0, 7) == T0 + 7000
    assert store.message_store_time("T", 0, 12) == -1
    assert store.earliest_message_time("T", 5) == -1  # empty queue
    # The store-wide one needs 2 * max_message_size readable at the log's start (as 4.4.0).
    assert store.earliest_message_time() == T0
    assert store.close()
    os.remove(h.cq_dir(root) / "00000000000000000000")
    # Without the queue ledger (a broker's store) a missing first file reads as the cleaner's
    # work; with it, the open would rebuild the file (tests/crash/test_derived_files_rebuilt.py).
    os.remove(root / "queue_ledger.msgpack")
    store = open_store(root, **settings)
    assert store.earliest_message_time("T", 0) == T0 + 4000  # the message at the new min offset


def test_earliest_message_time_of_a_store_with_little_data_is_minus_one(open_store: Open) -> None:
    store = open_store()  # 4 MiB max message size: 8 MiB must be readable, as in 4.4.0
    h.put_n(store, 2)
    assert store.earliest_message_time() == -1


def test_commitlog_data_runs_from_an_offset_to_the_readable_end_of_its_segment(tmp_path: Path, open_store: Open) -> None:
    root = tmp_path / "store"
    store = open_store(root, mapped_file_size_commitlog_bytes=4096)
    results = []
    while not results or results[-1].commitlog_offset < 4096:
        results += h.put_n(store, 1)
    last = results[-1]
    end = last.commitlog_offset + last.wrote_bytes
    start, data = store.get_commitlog_data(results[1].commitlog_offset)
    assert start == results[1].commitlog_offset and len(data) == 4096 - start  # up to the segment's end
    assert codec.read_record(data, 0).record.queue_offset == 1
    start, data = store.get_commitlog_data(4096)
    assert (start, len(data)) == (4096, end - 4096)  # the last segment: up to what is written
    assert store.get_commitlog_data(4096, max_bytes=10) == (4096, data[:10])
    assert store.get_commitlog_data(end) is None
    os.remove(root / "commitlog" / "00000000000000000000")
    assert store.close()
    store = open_store(root, mapped_file_size_commitlog_bytes=4096)
    start, data = store.get_commitlog_data(0)  # offset 0 reads from the first segment there is
    assert start == 4096 and codec.read_record(data, 0).record.queue_offset == last.queue_offset
    assert store.get_commitlog_data(100) is None


def _query_on(path: str, store: MessageStore, monkeypatch: pytest.MonkeyPatch, *args: object) -> QueryResult:
    from mqstore.storage import speedups

    with monkeypatch.context() as m:
        if path == "python":
            m.setattr(speedups, "native", None)
        return store.query(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ["c", "python"])
def test_other_keys_of_the_same_hash_do_not_use_up_a_querys_walk(
    open_store: Open, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Review 125 F2: "T#Aa" and "T#BB" share a Java hash; 40 newer "BB" hits filled a walk of
    max_count hits, and the stored "Aa" was answered as none, unsaid (max_count 1 to 32)."""
    store = open_store()
    assert store.put(Message(topic="T", body=b"the Aa one", keys=["Aa"])).ok
    for i in range(40):
        assert store.put(Message(topic="T", body=b"BB %d" % i, keys=["BB"])).ok
    for max_count in (1, 5, 32, None):
        result = _query_on(path, store, monkeypatch, "T", "Aa", max_count)
        assert [m.body for m in result.messages] == [b"the Aa one"] and result.detail == "", (max_count, result)
    # Past the most one query reads (max_msgs_num_batch), the answer says it may be short.
    assert len(_query_on(path, store, monkeypatch, "T", "BB", 64).messages) == 40
    cut = open_store(Path(store.config.root_dir + "-b"), max_msgs_num_batch=16)
    for i in range(20):
        assert cut.put(Message(topic="T", body=b"BB %d" % i, keys=["BB"])).ok
    assert cut.put(Message(topic="T", body=b"the Aa one", keys=["Aa"])).ok
    result = _query_on(path, cut, monkeypatch, "T", "BB", 32)
    assert len(result.messages) == 15 and "stopped at 16 hits" in result.detail, result.detail  # (one hit: the Aa)


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_message_whose_keys_repeat_the_key_is_answered_once(
    open_store: Open, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Review 125 F2: a message indexed 40 times under one key filled the answer with copies of
    itself, and the older message with the key was left out."""
    store = open_store()
    assert store.put(Message(topic="T", body=b"older", keys=["order-7"])).ok
    assert store.put(Message(topic="T", body=b"newer", keys=["order-7"] * 40)).ok
    result = _query_on(path, store, monkeypatch, "T", "order-7")
    assert sorted(m.body for m in result.messages) == [b"newer", b"older"] and result.detail == "", result


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_query_answers_the_messages_stored_within_its_window_to_the_millisecond(
    open_store: Open, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Review 125 F3: an index entry's time is its file's begin plus whole seconds, and the
    window was judged on it: messages stored just after begin_ms were missed and ones stored
    just after end_ms served."""
    clock = ManualClock()
    store = open_store(clock_ms=clock)
    times = [T0 + ms for ms in (0, 300, 900, 1250, 1800, 2100, 2600, 3050)]
    for ms in times:
        put_at(store, clock, ms, "k")
    assert store.wait_for_messages("T", 0, len(times) - 1, timeout_s=10)
    for begin, end in ((T0 + 250, T0 + 1250), (T0 + 301, T0 + 2099), (T0 + 950, T0 + 3000), (T0, T0 + 299)):
        result = _query_on(path, store, monkeypatch, "T", "k", 32, begin, end)
        assert sorted(m.store_timestamp for m in result.messages) == [t for t in times if begin <= t <= end], (begin, end)


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_query_walked_again_answers_the_newest_max_count_messages(
    open_store: Open, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Review 127 F3: a walk made again with max_msgs_num_batch (a newer "BB" of the same hash
    among the first max_count hits) kept the oldest max_count of its hits."""
    store = open_store()
    for i in range(10):
        assert store.put(Message(topic="T", body=b"%d" % i, keys=["Aa"])).ok
    assert store.put(Message(topic="T", body=b"bb", keys=["BB"])).ok
    result = _query_on(path, store, monkeypatch, "T", "Aa", 3)
    assert [m.body for m in result.messages] == [b"7", b"8", b"9"] and result.detail == "", result


@pytest.mark.parametrize("path", ["c", "python"])
def test_the_first_message_of_a_new_index_file_is_found_at_its_own_store_time(
    open_store: Open, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Review 127 F4: a new index file is seeded with the previous one's end time; its first
    entry's time was taken against that, then its begin set to the entry's own store time (the
    §10.6 quirk, RocketMQ's too). Read as begin + diff, the entry lay later by the gap: a window
    holding the message missed it, unsaid, until the window reached past the gap."""
    clock = ManualClock()
    store = open_store(clock_ms=clock, max_index_num=6, max_hash_slot_num=16)
    for i in range(5):  # fills the first file (5 entries)
        put_at(store, clock, T0 + i * 1000, f"fill{i}")
    at = T0 + 4000 + 3_600_000 + 250  # an hour later: the first entry of the second file
    put_at(store, clock, at, "K")
    store.query("T", "none", 1)  # (waits until the index covers this thread's puts)
    assert len(list((Path(store.config.root_dir) / "index").iterdir())) == 2
    for begin, end in ((at, at), (at - 60_000, at + 999), (at - 1, at)):
        result = _query_on(path, store, monkeypatch, "T", "K", 32, begin, end)
        assert [m.store_timestamp for m in result.messages] == [at], (begin - at, end - at, result)
    assert _query_on(path, store, monkeypatch, "T", "K", 32, at + 1, at + 7_200_000).messages == ()
