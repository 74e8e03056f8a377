"""reads.py without actors: a real broker's commitlog segment, ConsumeQueue units written here,
a `ReadView` built by hand, and the thread's readers. Every get status, tag filtering, the
"record must be its queue's own" rule and the query loop, as plain function calls."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mqstore import GetMessageStatus as S
from mqstore import StoreConfig, reads
from mqstore.messages import QueueBounds, UnitsReply
from mqstore.read_view import ReadView, ReadViewPublisher
from mqstore.storage import codec
from mqstore.storage.fs import RealFileSystem

h = sys.modules["mqstore_read_test_helpers"]
SEGMENT = 8192
RECORDS = 47  # broker-sample-a: 47 messages of 172 bytes, topic abc, queue 0, tag TAG1
CQ_FILE = 64 * h.UNIT


@pytest.fixture
def store_dir(tmp_path: Path) -> tuple[StoreConfig, list[codec.MessageRecord]]:
    """broker-sample-a's segment, and its queue abc/0 written as units (every record, offset
    0..46) into one full-size ConsumeQueue file; as the ConsumeQueue actor would have."""
    root = tmp_path / "store"
    (root / "commitlog").mkdir(parents=True)
    shutil.copy(h.FIXTURES / "broker-sample-a" / "commitlog" / "00000000000000000000", root / "commitlog")
    data = (root / "commitlog" / "00000000000000000000").read_bytes()
    records = []
    pos = 0
    while len(records) < RECORDS:
        record = codec.read_message(data, pos, None, max_message_size=4 << 20)
        assert record is not None
        records.append(record)
        pos += record.total_size
    units = b"".join(codec.encode_cq_unit(r.commitlog_offset, r.total_size, codec.tags_code(r.tags)) for r in records)
    queue = root / "consumequeue" / "abc" / "0"
    queue.mkdir(parents=True)
    (queue / "00000000000000000000").write_bytes(units + bytes(CQ_FILE - len(units)))
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commitlog_bytes=SEGMENT,
                      mapped_file_size_consume_queue_bytes=CQ_FILE)  # fmt: skip
    return cfg, records


def view_of(bounds: dict[tuple[str, int], tuple[int, int]], *, live: bool = True) -> ReadView:
    publisher = ReadViewPublisher()
    if live:
        publisher.publish_queues(QueueBounds(bounds=bounds, dispatched_offset=RECORDS * 172, complete=True))
    return publisher.view


def readers_for(cfg: StoreConfig) -> reads.ThreadReaders:
    return reads.ThreadReaders(RealFileSystem(), cfg, lambda: 0, lambda _reader: None)


def test_the_status_ladder_of_a_view(store_dir: tuple[StoreConfig, list[codec.MessageRecord]]) -> None:
    cfg, _records = store_dir
    readers = readers_for(cfg)
    view = view_of({("abc", 0): (2, RECORDS), ("empty", 0): (0, 0)})

    def get(topic: str, offset: int) -> tuple[S, int] | None:
        found = reads.get_from_view(view, readers, cfg, topic, 0, offset, 32)
        return None if found is None else (found.status, found.next_begin_offset)

    assert get("unknown", 5) == (S.NO_MESSAGE_IN_QUEUE, 0)  # a live table is complete
    assert get("empty", 0) == (S.NO_MESSAGE_IN_QUEUE, 0)
    assert get("abc", 1) == (S.OFFSET_TOO_SMALL, 2)
    assert get("abc", RECORDS) == (S.OFFSET_OVERFLOW_ONE, RECORDS)
    assert get("abc", RECORDS + 3) == (S.OFFSET_OVERFLOW_BADLY, RECORDS)
    assert get("abc", 2) == (S.FOUND, 34)  # 32 in memory per batch
    assert reads.get_from_view(view_of({}, live=False), readers, cfg, "abc", 0, 2, 32) is None, "not live: ask"
    readers.close()


def test_found_messages_tags_and_byte_limits(store_dir: tuple[StoreConfig, list[codec.MessageRecord]]) -> None:
    cfg, records = store_dir
    readers = readers_for(cfg)
    view = view_of({("abc", 0): (0, RECORDS)})
    found = reads.get_from_view(view, readers, cfg, "abc", 0, 10, 3)
    assert found is not None and found.status is S.FOUND
    assert [m.commitlog_offset for m in found.messages] == [r.commitlog_offset for r in records[10:13]]
    assert (found.next_begin_offset, found.min_offset, found.max_offset) == (13, 0, RECORDS)
    raw = reads.get_from_view(view, readers, cfg, "abc", 0, 10, 2, raw=True)
    assert raw is not None and raw.raw[0] == codec.encode_record(records[10])
    miss = reads.get_from_view(view, readers, cfg, "abc", 0, 0, 4, tags="OTHER||X")
    assert miss is not None and (miss.status, miss.next_begin_offset) == (S.NO_MATCHED_MESSAGE, RECORDS)
    hit = reads.get_from_view(view, readers, cfg, "abc", 0, 0, 4, tags="X || TAG1")
    assert hit is not None and [m.queue_offset for m in hit.messages] == [0, 1, 2, 3]
    one = reads.get_from_view(view, readers, cfg, "abc", 0, 0, 4, max_total_bytes=10)
    assert one is not None and [m.queue_offset for m in one.messages] == [0], "always at least one"
    readers.close()


def test_units_that_are_not_the_queues_own_leave_the_answer_to_the_owner(
    store_dir: tuple[StoreConfig, list[codec.MessageRecord]],
) -> None:
    """A bound claiming more than is written (zeros), or a view naming another queue's file:
    the view's reader returns None, never a wrong message."""
    cfg, _records = store_dir
    readers = readers_for(cfg)
    assert reads.get_from_view(view_of({("abc", 0): (0, RECORDS + 5)}), readers, cfg, "abc", 0, RECORDS, 4) is None
    queue1 = Path(cfg.consume_queue_dir) / "abc" / "1"
    shutil.copytree(Path(cfg.consume_queue_dir) / "abc" / "0", queue1)
    assert reads.get_from_view(view_of({("abc", 1): (0, RECORDS)}), readers, cfg, "abc", 1, 0, 4) is None
    readers.close()


def test_the_owners_answer_goes_through_the_same_ladder(store_dir: tuple[StoreConfig, list[codec.MessageRecord]]) -> None:
    cfg, _records = store_dir
    readers = readers_for(cfg)
    gone = UnitsReply(exists=True, min_offset=0, max_offset=RECORDS, units=None, next_file_offset=64, commitlog_head=0)
    r = reads.get_from_units(gone, readers, cfg, ("abc", 0), 5, 32)
    assert (r.status, r.next_begin_offset) == (S.OFFSET_FOUND_NULL, 64)
    absent = UnitsReply(exists=False, min_offset=0, max_offset=0, units=None, next_file_offset=0, commitlog_head=0)
    assert reads.get_from_units(absent, readers, cfg, ("abc", 0), 5, 32).status is S.NO_MESSAGE_IN_QUEUE
    readers.close()


def _owner_units(records: list[codec.MessageRecord], order: list[int], base: int = 0) -> bytes:
    """Units pointing at `records[k]` for each k of `order`, in the segment starting at `base`."""
    return b"".join(codec.encode_cq_unit(base + records[k].commitlog_offset, records[k].total_size,
                                         codec.tags_code(records[k].tags)) for k in order)  # fmt: skip


@pytest.mark.parametrize("raw", [False, True])
def test_the_owners_answer_never_serves_a_record_that_is_not_its_queues_own(
    store_dir: tuple[StoreConfig, list[codec.MessageRecord]], raw: bool
) -> None:
    """Review 144 F2: with a middle segment replaced under the running store, the direct read
    found records of other queue offsets, asked the owner, and the owner's answer served them
    (FOUND, no detail), or passed over what was no record there as "no matched message": a
    consumer took other messages for acknowledged ones, or skipped 237, and moved past. The
    owner's answer checks what the direct read checks, plus where each record says it was
    stored. Another segment's bytes (a log to put back) stop the read before them, the offset
    kept; a unit pointing at another queue's message of this segment (a damaged unit) is
    skipped, said, as a corrupt record is."""
    cfg, records = store_dir
    readers = readers_for(cfg)
    # Segment 1 holds segment 0's bytes, as if renamed over by a copy of it.
    commitlog = Path(cfg.commitlog_dir)
    (commitlog / ("%020d" % SEGMENT)).write_bytes((commitlog / ("%020d" % 0)).read_bytes())

    def owner(units: bytes, offset: int, queue: tuple[str, int] = ("abc", 0)) -> reads.GetResult:
        reply = UnitsReply(exists=True, min_offset=0, max_offset=100, units=units, next_file_offset=0, commitlog_head=0)
        return reads.get_from_units(reply, readers, cfg, queue, offset, 32, raw=raw)

    def served(result: reads.GetResult) -> list[int]:
        if raw:
            return [int.from_bytes(r[20:28], "big") for r in result.raw]
        return [m.queue_offset for m in result.messages]

    whole = owner(_owner_units(records, list(range(10, 20))), 10)
    assert (whole.status, served(whole), whole.next_begin_offset, whole.detail) == (S.FOUND, list(range(10, 20)), 20, "")
    # Queue offsets 13.. lie in segment 1, whose file holds segment 0's records 3..: stopped before them.
    replaced = _owner_units(records, [10, 11, 12]) + _owner_units(records, [3, 4], base=SEGMENT)
    shifted = owner(replaced, 10)
    assert (shifted.status, served(shifted), shifted.next_begin_offset) == (S.FOUND, [10, 11, 12], 13)
    at = SEGMENT + records[3].commitlog_offset
    assert f"what lies at commitlog offset {at} is not this queue's message" in shifted.detail, shifted.detail
    assert f"stored at commitlog offset {records[3].commitlog_offset}" in shifted.detail, shifted.detail
    # Nothing before it: not readable, the offset kept (as for a segment that cannot be mapped).
    first = owner(_owner_units(records, [3, 4], base=SEGMENT), 13)
    assert (first.status, served(first), first.next_begin_offset) == (S.NO_MATCHED_LOGIC_QUEUE, [], 13)
    assert "nothing was skipped" in first.detail and f"segment {SEGMENT:020d} starts with records stored at" in first.detail
    # Out of step with its records (no record begins there): the same, the segment's first record tells.
    between = owner(codec.encode_cq_unit(SEGMENT + 100, 172, 0), 13)
    assert (between.status, between.next_begin_offset) == (S.NO_MATCHED_LOGIC_QUEUE, 13), between
    assert "no whole record of 172 bytes lies there" in between.detail, between.detail
    # In segment 0, whose records are where they say: units of queue 1 pointing at queue 0's
    # messages, or between records, are damage: skipped, said, never served.
    told: list[tuple[int, str]] = []
    reply = UnitsReply(exists=True, min_offset=0, max_offset=100, units=_owner_units(records, [0, 1, 2]) +
                       codec.encode_cq_unit(100, 172, 0), next_file_offset=0, commitlog_head=0)  # fmt: skip
    other = reads.get_from_units(reply, readers, cfg, ("abc", 1), 0, 32, raw=raw, on_corrupt=lambda o, r: told.append((o, r)))
    assert (other.status, served(other), other.next_begin_offset) == (S.NO_MATCHED_MESSAGE, [], 4), other
    assert [o for o, _ in told] == [0, records[1].commitlog_offset, records[2].commitlog_offset, 100]
    assert "skipped the corrupt record at commitlog offset 100" in other.detail, other.detail
    if not raw:  # (raw records' topics are not decoded; their queue ids and offsets are checked)
        renamed = owner(_owner_units(records, [0]), 0, ("abd", 0))
        assert (renamed.status, served(renamed), renamed.next_begin_offset) == (S.NO_MATCHED_MESSAGE, [], 1), renamed
    readers.close()


@pytest.mark.parametrize("raw", [False, True])
def test_one_damaged_field_is_not_another_log_and_a_replaced_segment_stops_every_read(
    store_dir: tuple[StoreConfig, list[codec.MessageRecord]], raw: bool
) -> None:
    """Review 145 F1: a flipped bit in a record's physical-offset field (or in a segment's first
    record's) stopped its queue for good, as "another segment's bytes". Its topic, queue and
    queue offset are the unit's: it is served, as the direct read serves it (`verify` reports
    the damage). Review 145 F2: a segment the writer found replaced (the view's `replaced`)
    stops every read into it, even where its records look like the queue's own (another
    store's segment of the same shape)."""
    cfg, records = store_dir
    segment = Path(cfg.commitlog_dir) / ("%020d" % 0)
    data = bytearray(segment.read_bytes())
    for k in (0, 5):  # the first record's physical-offset field, and a middle one's
        data[records[k].commitlog_offset + 35] ^= 0x40
    segment.write_bytes(bytes(data))
    readers = readers_for(cfg)

    def owner(offset: int, units: bytes, replaced: tuple[tuple[int, int], ...] = ()) -> reads.GetResult:
        reply = UnitsReply(exists=True, min_offset=0, max_offset=RECORDS, units=units, next_file_offset=0, commitlog_head=0)
        return reads.get_from_units(reply, readers, cfg, ("abc", 0), offset, 32, raw=raw, replaced=replaced)

    def count(result: reads.GetResult) -> int:
        return len(result.raw if raw else result.messages)

    every = owner(0, _owner_units(records, list(range(RECORDS))))
    assert (every.status, count(every), every.next_begin_offset) == (S.FOUND, 32, 32), every
    assert readers.commitlog_reader().not_this_segment(records[7].commitlog_offset) == ""
    stopped = owner(3, _owner_units(records, [3, 4, 5]), replaced=((0, SEGMENT),))
    assert (stopped.status, count(stopped), stopped.next_begin_offset) == (S.NO_MATCHED_LOGIC_QUEUE, 0, 3), stopped
    assert "was replaced, renamed away or deleted by another process" in stopped.detail, stopped.detail
    view = view_of({("abc", 0): (0, RECORDS)})
    direct = reads.get_from_view(replace(view, replaced=((0, SEGMENT),)), readers, cfg, "abc", 0, 3, 8, raw=raw)
    assert direct is not None and (direct.status, direct.next_begin_offset) == (S.NO_MATCHED_LOGIC_QUEUE, 3), direct
    readers.close()


def test_bounds_and_store_times_from_the_view(store_dir: tuple[StoreConfig, list[codec.MessageRecord]]) -> None:
    cfg, records = store_dir
    readers = readers_for(cfg)
    view = view_of({("abc", 0): (0, RECORDS)})
    assert reads.bounds_from_view(view, "abc", 0) == (0, RECORDS)
    assert reads.bounds_from_view(view, "nope", 3) == (0, 0)
    assert reads.bounds_from_view(view_of({}, live=False), "abc", 0) is None
    assert reads.unit_store_time(view, readers, "abc", 0, 7) == records[7].store_timestamp
    assert reads.unit_store_time(view, readers, "abc", 0, RECORDS) == -1
    readers.close()


def test_the_query_loop_checks_each_hit_against_the_records_keys(
    store_dir: tuple[StoreConfig, list[codec.MessageRecord]],
) -> None:
    cfg, records = store_dir
    readers = readers_for(cfg)
    key = records[5].keys
    wanted = [r.commitlog_offset for r in records if key in r.key_list]
    asked: list[tuple[int, int]] = []

    def hits(topic: str, k: str, max_num: int, begin: int, end: int) -> tuple[list[int], int, int]:
        asked.append((begin, end))
        # An index answers hash hits: a collision (record 0) must be dropped by the loop.
        return [records[0].commitlog_offset, *wanted], 111, 222

    result = reads.query_messages(hits, readers.commitlog_reader(), cfg, "abc", key, 32, 0, 2**63 - 1)
    assert [m.commitlog_offset for m in result.messages] == wanted
    assert (result.index_last_update_timestamp, result.index_last_update_phy_offset) == (111, 222)
    assert len(asked) == 1
    none = reads.query_messages(lambda *a: ([records[0].commitlog_offset], 1, 2), readers.commitlog_reader(), cfg,
                                "abc", "no-such-key", 32, 0, 2**63 - 1)  # fmt: skip
    assert none.messages == ()
    readers.close()
