"""CommitLog: layout, put paths, roll-over, readers, damaged data and recovery (§3.7, §6, §11)."""

from __future__ import annotations

import os
import struct
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.storage.codec import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    HostAddress,
    DispatchFields,
    MessageRecord,
    RecordKind,
    encode_message,
    msg_id,
    segment_file_name,
)
from mqstore.storage import scan
from mqstore.storage.commitlog import CommitLog, CommitLogReader, EncodedRecords, scan_commitlog_dir
from mqstore.storage.fs import FileSystem, RealFileSystem, SimulatedFileSystem
from mqstore.storage.mapped_file import TransientStorePool
from mqstore.storage.status import AppendMessageStatus, PutMessageStatus


SEG = 4096
ManualClock = Any  # the conftest `clock` fixture: callable, with .now_ms and .advance(ms)


class _Clock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms

BORN = HostAddress("10.0.0.2", 5555)
STORE = HostAddress("192.168.1.10", 10911)


def rec(topic: str = "TopicA", queue_id: int = 0, body: bytes = b"hello", sys_flag: int = 0, props: str = "TAGS\x01t\x02") -> EncodedRecords:
    data = encode_message(topic=topic, queue_id=queue_id, body=body, properties=props, sys_flag=sys_flag,
                          born_timestamp=1, born_host=BORN, store_host=STORE)
    return EncodedRecords((data,), topic, queue_id, sys_flag, STORE)


def batch(records: list[EncodedRecords]) -> EncodedRecords:
    """One put of several records (they share topic, queue, sys flag and host)."""
    return records[0]._replace(datas=tuple(r.datas[0] for r in records))


def make_log(fs: FileSystem, root: str, clock: ManualClock, size: int = SEG, **kw: object) -> CommitLog:
    return CommitLog(fs, os.path.join(root, "commitlog"), mapped_file_size=size, clock_ms=clock, **kw)  # type: ignore[arg-type]


def messages(cl: CommitLog, start: int = 0) -> list[MessageRecord]:
    return [r.record for r in cl.iter_records(start) if r.kind is RecordKind.MESSAGE]  # type: ignore[misc]


def test_single_puts_have_rocketmq_layout_and_queue_offsets(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    results = []
    for i in range(6):
        results.append(cl.put_message(rec(queue_id=i % 2, body=b"m%d" % i), clock.now_ms + i))
    assert all(r.status is PutMessageStatus.PUT_OK and r.is_ok for r in results)
    assert cl.topic_queue_table == {"TopicA-0": 3, "TopicA-1": 3}
    assert fs.listdir(cl.store_path) == [segment_file_name(0)]
    offset = 0
    for i, res in enumerate(results):
        a = res.append_result
        assert a is not None
        assert a.wrote_offset == offset and a.logics_offset == i // 2 and a.msg_num == 1
        assert a.msg_id == msg_id(STORE, offset)
        assert a.store_timestamp == clock.now_ms + i
        offset += a.wrote_bytes
    recs = messages(cl)
    assert [(m.queue_id, m.queue_offset, m.body) for m in recs] == [(i % 2, i // 2, b"m%d" % i) for i in range(6)]
    assert [m.commitlog_offset for m in recs] == [r.append_result.wrote_offset for r in results]  # type: ignore[union-attr]
    assert cl.get_max_offset() == offset and cl.get_min_offset() == 0


def test_prepared_and_rollback_get_queue_offset_zero_and_do_not_advance(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    cl.put_message(rec(), 1)
    cl.put_message(rec(), 1)
    p = cl.put_message(rec(sys_flag=TRANSACTION_PREPARED_TYPE), 2)
    r = cl.put_message(rec(sys_flag=TRANSACTION_ROLLBACK_TYPE), 3)
    c = cl.put_message(rec(sys_flag=TRANSACTION_COMMIT_TYPE), 4)
    assert p.append_result.logics_offset == 0 and r.append_result.logics_offset == 0  # type: ignore[union-attr]
    assert c.append_result.logics_offset == 2  # type: ignore[union-attr]
    assert [m.queue_offset for m in messages(cl)] == [0, 1, 0, 0, 2]
    assert cl.topic_queue_table["TopicA-0"] == 3


def test_batch_assigns_consecutive_offsets_and_comma_joined_ids(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    cl.put_message(rec(queue_id=3), 10)
    res = cl.put_messages(batch([rec(queue_id=3, body=b"b%d" % i) for i in range(4)]), 20)
    a = res.append_result
    assert res.status is PutMessageStatus.PUT_OK and a is not None
    assert a.msg_num == 4 and a.logics_offset == 1
    recs = messages(cl)
    assert [m.queue_offset for m in recs] == [0, 1, 2, 3, 4]
    assert a.msg_id == ",".join(msg_id(STORE, m.commitlog_offset) for m in recs[1:])
    assert all(m.store_timestamp == 20 for m in recs[1:])
    assert cl.topic_queue_table == {"TopicA-3": 5}


def test_batch_with_transaction_type_or_mixed_is_illegal(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    res = cl.put_messages(batch([rec(sys_flag=TRANSACTION_PREPARED_TYPE)]), 1)
    assert res.status is PutMessageStatus.MESSAGE_ILLEGAL and not res.is_ok
    assert cl.get_max_offset() == 0


def test_roll_over_writes_exact_blank_header_and_zero_rest(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    one = rec(body=b"x" * 200)
    size = len(one.datas[0])
    n = 0
    while (n + 1) * size + 8 <= SEG:
        assert cl.put_message(one, 1).status is PutMessageStatus.PUT_OK
        n += 1
    res = cl.put_message(one, 2)
    assert res.status is PutMessageStatus.PUT_OK
    assert res.append_result.wrote_offset == SEG  # type: ignore[union-attr]
    blank_at = n * size
    raw = fs.read_bytes(os.path.join(cl.store_path, segment_file_name(0)))
    assert raw[blank_at : blank_at + 8] == struct.pack(">i", SEG - blank_at) + b"\xcb\xd4\x31\x94"
    assert raw[blank_at + 8 :] == bytes(SEG - blank_at - 8)
    assert cl.last_full_file is not None and cl.last_full_file.file_from_offset == 0
    kinds = [(r.kind, r.offset) for r in cl.iter_records(0)]
    assert kinds[n] == (RecordKind.BLANK, blank_at)
    assert kinds[n + 1] == (RecordKind.MESSAGE, SEG)
    assert kinds[-1] == (RecordKind.END_OF_DATA, SEG + size)


def test_blank_header_matches_fixture_style_for_108_bytes(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock, size=8192)
    filler = rec(body=b"f" * (8084 - 91 - 6 - 7), props="TAGS\x01t\x02")
    assert len(filler.datas[0]) == 8084
    assert cl.put_message(filler, 1).is_ok
    cl.put_message(rec(), 2)
    raw = fs.read_bytes(os.path.join(cl.store_path, segment_file_name(0)))
    assert raw[8084:8092] == b"\x00\x00\x00\x6c\xcb\xd4\x31\x94"


def test_batch_that_does_not_fit_moves_whole_to_next_file(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    big = rec(body=b"y" * 3000)
    cl.put_message(big, 1)
    records = [rec(body=b"z" * 300) for _ in range(3)]
    res = cl.put_messages(batch(records), 2)
    assert res.is_ok and res.append_result.wrote_offset == SEG  # type: ignore[union-attr]
    recs = messages(cl)
    assert [m.commitlog_offset // SEG for m in recs] == [0, 1, 1, 1]
    assert [m.queue_offset for m in recs] == [0, 1, 2, 3]


def test_oversized_records_are_illegal_and_nothing_is_written(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock, size=64 * 1024, max_message_size=1024)
    res = cl.put_message(rec(body=b"q" * 2000), 1)
    assert res.status is PutMessageStatus.MESSAGE_ILLEGAL
    assert res.append_result is not None and res.append_result.status is AppendMessageStatus.MESSAGE_SIZE_EXCEEDED
    res = cl.put_messages(batch([rec(body=b"q" * 600), rec(body=b"q" * 600)]), 1)  # sum > max
    assert res.status is PutMessageStatus.MESSAGE_ILLEGAL
    small = make_log(fs, root + "/x" if root != "/store" else "/store/x", clock, size=512)
    fs.makedirs(small.store_path)
    assert small.put_message(rec(body=b"q" * 600), 1).status is PutMessageStatus.MESSAGE_ILLEGAL  # > segment
    assert cl.get_max_offset() == 0 and cl.topic_queue_table == {}


def test_create_mapped_file_failed_when_no_file() -> None:
    clock = _Clock()
    fs = SimulatedFileSystem(clock_ms=clock)
    fs.makedirs("/s")
    cl = make_log(fs, "/s", clock)
    fs.inject_fault("map", path_contains="commitlog")
    assert cl.put_message(rec(), 1).status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED
    assert cl.put_message(rec(), 1).is_ok
    cl2 = make_log(fs, "/s/other", clock, allocator=lambda a, b, c: None)
    assert cl2.put_message(rec(), 1).status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED


def test_write_buffer_pool_path_readers_see_committed_only(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    pool = TransientStorePool(3, SEG)
    cl = make_log(fs, root, clock, write_buffer_pool=pool)
    for _ in range(30):
        assert cl.put_message(rec(body=b"w" * 100), 1).is_ok
    assert cl.get_max_offset() < 30 * 205
    while not cl.commit(0):
        pass
    assert len(messages(cl)) == 30
    assert pool.remain_buffer_numbs() >= 1
    while not cl.flush(0):
        pass
    assert cl.flushed_where == cl.get_max_offset()


def test_get_data_message_and_pickup_timestamp(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    a = cl.put_message(rec(), 777).append_result
    b = cl.put_message(rec(), 888).append_result
    assert a is not None and b is not None
    start, data = cl.get_data(0)  # type: ignore[misc]
    assert start == 0 and len(data) == a.wrote_bytes + b.wrote_bytes
    assert cl.get_data(b.wrote_offset, max_bytes=10) == (b.wrote_offset, data[b.wrote_offset : b.wrote_offset + 10])
    assert cl.get_message(b.wrote_offset, b.wrote_bytes) == data[b.wrote_offset :]
    assert cl.pickup_store_timestamp(b.wrote_offset, b.wrote_bytes) == 888
    assert cl.pickup_store_timestamp(b.wrote_offset + 1000, b.wrote_bytes) == -1
    read = cl.read_record_at(b.wrote_offset, check_crc=True)
    assert read is not None and read.kind is RecordKind.MESSAGE and read.offset == b.wrote_offset


# --- broker samples -------------------------------------------------------------------------


def test_scan_commitlog_dir_on_broker_sample() -> None:
    reads = list(scan_commitlog_dir("/work/shared/fixtures/broker-sample-a/commitlog", check_crc=True))
    assert [r.kind for r in reads[:47]] == [RecordKind.MESSAGE] * 47
    assert [r.offset for r in reads[:47]] == [i * 172 for i in range(47)]
    assert reads[47].kind is RecordKind.BLANK and reads[47].offset == 8084 and reads[47].size == 108
    assert len(reads) == 48
    assert reads[0].record is not None and reads[0].record.topic == "abc"


@pytest.mark.parametrize("sample", ["broker-sample-a", "broker-sample-b"])
def test_broker_sample_recovers_normally_and_appends_in_new_file(
    copy_commitlog: Callable[[str], str], sample: str, clock: ManualClock
) -> None:
    path = copy_commitlog(sample)
    cl = CommitLog(RealFileSystem(), path, mapped_file_size=8192, clock_ms=clock)
    assert cl.load()
    progress: list[tuple[int, int]] = []
    assert cl.recover_normally(-1, progress=lambda done, total: progress.append((done, total))) == 8084
    # Sized by the data (issue 18): up to the END_OF_FILE header at 8084, not the segment's 8192.
    assert progress[-1] == (8092, 8092)
    assert cl.get_max_offset() == 8084 and cl.flushed_where == 8084
    assert [m.queue_offset for m in messages(cl)] == list(range(47))
    cl.topic_queue_table["abc-0"] = 47
    res = cl.put_message(rec(topic="abc"), clock.now_ms)
    assert res.is_ok and res.append_result.wrote_offset == 8192 and res.append_result.logics_offset == 47  # type: ignore[union-attr]
    with open(os.path.join(path, segment_file_name(0)), "rb") as f:
        assert f.read()[8084:8092] == b"\x00\x00\x00\x6c\xcb\xd4\x31\x94"
    assert sorted(os.listdir(path)) == [segment_file_name(0), segment_file_name(8192)]


def _damaged(copy_commitlog: Callable[[str], str], mutate: object) -> str:
    path = copy_commitlog("broker-sample-a")
    seg = os.path.join(path, segment_file_name(0))
    data = bytearray(open(seg, "rb").read())
    mutate(data)  # type: ignore[operator]
    open(seg, "wb").write(bytes(data))
    return path


def _cut_in_half(d: bytearray) -> None:
    d[10 * 172 + 86 :] = bytes(len(d) - 10 * 172 - 86)


def _flip_body(d: bytearray) -> None:
    d[5 * 172 + 90] ^= 0xFF


def _zero_header(d: bytearray) -> None:
    d[7 * 172 : 7 * 172 + 8] = bytes(8)


def _size_past_end(d: bytearray) -> None:
    struct.pack_into(">i", d, 46 * 172, 9000)


def _size_max(d: bytearray) -> None:
    struct.pack_into(">i", d, 3 * 172, 2**31 - 1)


@pytest.mark.parametrize(
    ("mutate", "bad_offset", "kinds"),
    [
        (_cut_in_half, 10 * 172, {RecordKind.CORRUPT}),
        (_flip_body, 5 * 172, {RecordKind.CORRUPT}),
        (_zero_header, 7 * 172, {RecordKind.END_OF_DATA, RecordKind.CORRUPT}),
        (_size_past_end, 46 * 172, {RecordKind.CORRUPT}),
        (_size_max, 3 * 172, {RecordKind.CORRUPT}),
    ],
)
def test_damaged_copies_are_reported_at_the_right_offset(
    copy_commitlog: Callable[[str], str], clock: ManualClock, mutate: object, bad_offset: int, kinds: set[RecordKind]
) -> None:
    path = _damaged(copy_commitlog, mutate)
    reads = list(scan_commitlog_dir(path, check_crc=True))
    assert reads[-1].kind in kinds and reads[-1].offset == bad_offset
    assert all(r.kind is RecordKind.MESSAGE for r in reads[:-1])
    cl = CommitLog(RealFileSystem(), path, mapped_file_size=8192, clock_ms=clock)
    assert cl.load()
    last = list(cl.iter_records(0, check_crc=True))[-1]
    assert last.kind in kinds and last.offset == bad_offset
    reader = CommitLogReader(RealFileSystem(), path, mapped_file_size=8192, limit=8192)
    last = list(reader.iter_records(0, check_crc=True))[-1]
    assert last.kind in kinds and last.offset == bad_offset
    reader.close()
    with open(os.path.join(path, segment_file_name(0)), "rb") as f:
        before = f.read()
    end = cl.recover_normally(-1)
    with open(os.path.join(path, segment_file_name(0)), "rb") as f:
        after = f.read()
    if mutate in (_cut_in_half, _zero_header):
        # A torn tail (nothing valid after it; a zeroed header whose own offset field says it
        # lies there is the put a writer died in): recovery ends the log there and zeroes it.
        assert end == bad_offset and not cl.quarantined
        assert after[bad_offset:] == bytes(8192 - bad_offset)
    else:
        # Valid records follow: the damage is quarantined, nothing is cut or changed.
        assert end == 8084 and [q.start for q in cl.quarantined] == [bad_offset], cl.quarantined
        assert after[:end] == before[:end]


def test_recover_abnormally_dispatches_truncates_and_zeroes_dirty_tail(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    for i in range(40):
        cl.put_message(rec(body=b"r%d" % i * 20), 1000 + i)
    end = cl.get_max_offset()
    last_file = cl.mapped_file_queue.last_mapped_file
    assert last_file is not None and last_file.file_from_offset > 0
    # a dirty tail: half a record after the last good one
    buf = last_file.mapped_buffer
    tail_pos = last_file.wrote_position
    garbage = rec(body=b"g" * 50).datas[0][:60]
    buf[tail_pos : tail_pos + 60] = garbage
    while not cl.flush(0):
        pass
    cl2 = make_log(fs, root, clock)
    assert cl2.load()
    dispatched: list[DispatchFields] = []
    assert cl2.recover_abnormally(min_timestamp=10**15, dispatch=dispatched.append) == end
    # started at the newest matching file: its messages only
    assert dispatched and dispatched[0].commitlog_offset == last_file.file_from_offset
    assert fs.read_bytes(last_file.file_name)[tail_pos:] == bytes(SEG - tail_pos)
    # with an old checkpoint time, recovery starts at the first file
    dispatched.clear()
    cl3 = make_log(fs, root, clock)
    assert cl3.load()
    assert cl3.recover_abnormally(min_timestamp=0, dispatch=dispatched.append) == end
    assert len(dispatched) == 40


def test_recover_abnormally_with_no_files_returns_zero(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    assert cl.load()
    assert cl.recover_abnormally(0, lambda r: None) == 0
    assert cl.recover_normally(-1) == 0


def test_recover_normally_deletes_files_after_the_end(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    for _ in range(30):
        cl.put_message(rec(body=b"a" * 300), 1)
    n_files = len(cl.mapped_file_queue.mapped_files)
    assert n_files >= 3
    # zero the second-to-last file's first header: everything from there on is gone
    victim = cl.mapped_file_queue.mapped_files[-2]
    victim.mapped_buffer[0:8] = bytes(8)
    cl2 = make_log(fs, root, clock)
    cl2.load()
    assert cl2.recover_normally(-1) == victim.file_from_offset
    assert len(cl2.mapped_file_queue.mapped_files) == n_files - 1
    assert cl2.put_message(rec(), 5).append_result.wrote_offset == victim.file_from_offset  # type: ignore[union-attr]


# --- readers ---------------------------------------------------------------------------------


def test_reader_reads_only_below_limit_and_survives_deletion(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    offsets = [cl.put_message(rec(body=b"c" * 500), 1).append_result.wrote_offset for _ in range(20)]  # type: ignore[union-attr]
    reader = CommitLogReader(fs, cl.store_path, mapped_file_size=SEG)
    assert reader.read(0, 10) is None  # limit 0: nothing visible
    reader.set_limit(offsets[3])
    got = [r.offset for r in reader.iter_records(0) if r.kind is RecordKind.MESSAGE]
    assert got == offsets[:3]
    reader.set_limit(cl.get_max_offset())
    got = [r.offset for r in reader.iter_records(0) if r.kind is RecordKind.MESSAGE]
    assert got == offsets
    assert reader.min_offset() == 0
    assert cl.delete_expired_file(0, 0, 0, True, clock(), lambda ms: None) >= 1
    reader.refresh()
    assert reader.min_offset() == cl.get_min_offset()
    assert reader.read(offsets[0], 10) is None
    assert reader.read_record(offsets[0]) is None
    assert list(reader.iter_records(0)) == []
    reader.close()


def test_reader_gives_back_deleted_segments_from_another_thread_and_only_those(tmp_path: Any, clock: ManualClock) -> None:
    """release_deleted (review 46 M5) unmaps only segments whose files are gone: one missing
    from a listing made before it was created is kept; a segment named again after its map was
    given back is mapped anew at the owner's next refresh."""
    fs = RealFileSystem()
    cl = make_log(fs, str(tmp_path), clock)
    offsets = [cl.put_message(rec(body=b"d" * 500), 1).append_result.wrote_offset for _ in range(20)]  # type: ignore[union-attr]
    reader = CommitLogReader(fs, cl.store_path, mapped_file_size=SEG, limit=cl.get_max_offset())
    assert len([r for r in reader.iter_records(0) if r.kind is RecordKind.MESSAGE]) == 20
    listed = {int(name) for name in os.listdir(cl.store_path)}
    assert len(listed) >= 3
    assert reader.release_deleted(listed - {SEG}) == 0  # a stale listing: the file is there
    assert reader.read(offsets[0], 10) is not None
    first = os.path.join(cl.store_path, f"{0:020d}")
    saved = fs.read_bytes(first)
    os.remove(first)  # as the cleaner deletes it
    assert reader.release_deleted(listed - {0}) == 1
    # Retention's, not a hole (a get reading there says nothing), though the reader did not list since.
    assert not reader.within_log(offsets[0]) and reader.within_log(offsets[-1]) and not reader.has_hole
    assert reader.release_deleted(listed - {0}) == 0  # given back once
    assert reader.read(offsets[0], 10) is None and reader.read_record(offsets[0]) is None
    assert reader.read(offsets[-1], 10) is not None
    with open(first, "wb") as f:  # named again (a backup put back)
        f.write(saved)
    reader.refresh()
    assert reader.read(offsets[0], 10) == saved[:10]
    reader.close()


def test_reader_knows_a_hole_from_retention(tmp_path: Any, clock: ManualClock) -> None:
    """A segment missing between two present is a hole (review 116 L2: reads into it name it);
    the oldest missing is retention's."""
    fs = RealFileSystem()
    cl = make_log(fs, str(tmp_path), clock)
    offsets = [cl.put_message(rec(body=b"d" * 500), 1).append_result.wrote_offset for _ in range(20)]  # type: ignore[union-attr]
    cl.flush(0)
    assert offsets[-1] >= 2 * SEG
    reader = CommitLogReader(fs, cl.store_path, mapped_file_size=SEG, limit=cl.get_max_offset())
    assert not reader.has_hole
    os.remove(os.path.join(cl.store_path, f"{SEG:020d}"))
    reader.refresh()
    assert reader.has_hole and reader.within_log(SEG + 10)
    os.remove(os.path.join(cl.store_path, f"{0:020d}"))
    reader.refresh()
    assert not reader.has_hole and not reader.within_log(SEG + 10) and reader.within_log(offsets[-1])
    reader.close()
    # Review 121 F2: a reader whose listing predates retention's deletions (the head mapped,
    # the next ones parked) took the deleted head for the log's: no read of the listing since.
    reader = CommitLogReader(fs, cl.store_path, mapped_file_size=SEG, limit=cl.get_max_offset())
    os.remove(os.path.join(cl.store_path, f"{2 * SEG:020d}"))
    assert not reader.within_log(2 * SEG + 10)
    reader.close()


def test_reader_picks_up_new_files(any_fs: tuple[FileSystem, str], clock: ManualClock) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    cl.put_message(rec(), 1)
    reader = CommitLogReader(fs, cl.store_path, mapped_file_size=SEG, limit=10**9)
    for _ in range(20):
        cl.put_message(rec(body=b"n" * 400), 1)
    msgs = [r for r in reader.iter_records(0) if r.kind is RecordKind.MESSAGE]
    assert len(msgs) == 21
    reader.close()


def test_closing_a_reader_while_another_thread_holds_its_map_does_not_fail(tmp_path: Any, clock: ManualClock) -> None:
    """store.close() closes every thread's reader; one may be decoding in place just then."""
    cl = make_log(RealFileSystem(), str(tmp_path), clock)
    cl.put_message(rec(), 1)
    reader = CommitLogReader(RealFileSystem(), cl.store_path, mapped_file_size=SEG, limit=10**9)
    place = reader.select(0, 4)
    assert place is not None
    held = memoryview(place[0])  # what the C decoder holds for the length of one call
    reader.close()
    assert held[4:8].tobytes() == b"\xda\xa3\x20\xa7", "the map outlives close() while it is held (magic)"
    held.release()
    assert reader.min_offset() == -1, "the reader let go of every map"
    cl.close()


# --- simulated disk ----------------------------------------------------------------------


def test_flushed_records_survive_a_crash(clock: ManualClock) -> None:
    fs = SimulatedFileSystem(clock_ms=clock)
    fs.makedirs("/s")
    cl = make_log(fs, "/s", clock)
    for i in range(25):
        cl.put_message(rec(body=b"d%d" % i * 30), 100 + i)
    while not cl.flush(0):
        pass
    flushed = cl.flushed_where
    for i in range(25):
        cl.put_message(rec(body=b"u%d" % i * 30), 200 + i)
    for seed in range(5):
        after = fs.crash(seed)
        cl2 = make_log(after, "/s", clock)
        assert cl2.load()
        end = cl2.recover_abnormally(0, lambda r: None)
        assert end >= flushed
        bodies = [m.body for m in messages(cl2)]
        assert bodies[:25] == [b"d%d" % i * 30 for i in range(25)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.binary(max_size=900), st.booleans(), st.integers(1, 4)),
        min_size=1, max_size=40,
    )
)
def test_random_appends_read_back(ops: list[tuple[int, bytes, bool, int]]) -> None:
    clock = _Clock()
    fs = SimulatedFileSystem(clock_ms=clock)
    fs.makedirs("/h")
    cl = make_log(fs, "/h", clock)
    expected: list[tuple[int, int, bytes]] = []
    counters: dict[int, int] = {}
    for queue_id, body, as_batch, n in ops:
        if as_batch:
            res = cl.put_messages(batch([rec(queue_id=queue_id, body=body) for _ in range(n)]), clock())
            count = n
        else:
            res = cl.put_message(rec(queue_id=queue_id, body=body), clock())
            count = 1
        if res.is_ok:
            for _ in range(count):
                expected.append((queue_id, counters.get(queue_id, 0), body))
                counters[queue_id] = counters.get(queue_id, 0) + 1
        else:
            assert res.status is PutMessageStatus.MESSAGE_ILLEGAL
        clock.advance(1)
    got = [(m.queue_id, m.queue_offset, m.body) for m in messages(cl)]
    assert got == expected
    timestamps = [m.store_timestamp for m in messages(cl)]
    assert timestamps == sorted(timestamps)
    # and the same after a reload + normal recovery
    cl2 = make_log(fs, "/h", clock)
    assert cl2.load()
    assert cl2.recover_normally(-1) == cl.get_max_offset()
    assert [(m.queue_id, m.queue_offset, m.body) for m in messages(cl2)] == expected


def test_min_offset_skips_a_first_file_being_deleted_and_iter_stops_at_to_offset(
    any_fs: tuple[FileSystem, str], clock: ManualClock
) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    offsets = [cl.put_message(rec(body=b"e" * 700), 1).append_result.wrote_offset for _ in range(12)]  # type: ignore[union-attr]
    assert [r.offset for r in cl.iter_records(0, offsets[3])] == offsets[:3]
    first = cl.mapped_file_queue.first_mapped_file
    assert first is not None and first.hold()
    assert cl.delete_expired_file(0, 0, 120_000, True, clock(), lambda ms: None) == 0  # still held
    assert cl.get_min_offset() == SEG
    first.release()
    assert cl.retry_delete_first_file(120_000, clock())
    assert cl.get_min_offset() == SEG and cl.mapped_file_queue.min_offset() == SEG


def _log_whose_next_file_cannot_be_mapped() -> tuple[CommitLog, int]:
    """A log with one file filled up to `free` bytes before its end, whose next file fails
    to map once: the put that overflows answers CREATE_MAPPED_FILE_FAILED with the
    END_OF_FILE result of the callback, as RocketMQ's putMessage(s) does."""
    clock = _Clock()
    fs = SimulatedFileSystem(clock_ms=clock)
    fs.makedirs("/s")
    cl = make_log(fs, "/s", clock)
    assert cl.put_message(rec(body=b"y" * 3000), 1).is_ok
    fs.inject_fault("map", path_contains=segment_file_name(SEG))
    return cl, SEG - cl.get_max_offset()


def test_batch_end_of_file_returns_the_ids_of_the_records_built_before_the_overflow() -> None:
    # DefaultAppendMessageCallback.doAppend(MessageExtBatch): ids of the records whose running
    # total (plus the 8-byte blank header) still fitted, at the offsets they would have had.
    cl, free = _log_whose_next_file_cannot_be_mapped()
    start = SEG - free
    one = rec(body=b"z" * 300)
    size = len(one.datas[0])
    fitting = (free - 8) // size
    assert fitting >= 2
    res = cl.put_messages(batch([one] * (fitting + 2)), 2)
    eof = res.append_result
    assert res.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED and eof is not None
    assert eof.status is AppendMessageStatus.END_OF_FILE
    assert eof.msg_id == ",".join(msg_id(STORE, start + k * size) for k in range(fitting))
    assert eof.wrote_offset == start and eof.wrote_bytes == free and eof.logics_offset == 1
    assert cl.topic_queue_table == {"TopicA-0": 1}  # nothing of the batch counted


def test_batch_whose_first_record_overflows_and_single_put_end_of_file_ids() -> None:
    cl, free = _log_whose_next_file_cannot_be_mapped()
    start = SEG - free
    big = rec(body=b"w" * (free - 8 - 100))
    res = cl.put_messages(batch([big]), 2)
    assert res.append_result is not None and res.append_result.status is AppendMessageStatus.END_OF_FILE
    assert res.append_result.msg_id == ""  # no record was built before the overflow
    # A single message: its own id at the write position, computed before the space check.
    cl2, free2 = _log_whose_next_file_cannot_be_mapped()
    res = cl2.put_message(big, 3)
    assert res.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED
    assert res.append_result is not None and res.append_result.msg_id == msg_id(STORE, SEG - free2)
    assert start == SEG - free2


@pytest.mark.parametrize("fast", [True, False])
def test_next_queue_offsets_from_below_the_first_segment_counts_every_record_left(
    any_fs: tuple[FileSystem, str], clock: ManualClock, monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    """Review 62 H1: a queue rebuilt from the log's start asks from offset 0; with the first
    segments deleted by retention the walk found nothing below them and stopped, so the
    writer's table missed every record left and the next put reused their queue offsets."""
    monkeypatch.setattr(scan, "fast_scan_available", lambda: fast)
    fs, root = any_fs
    cl = make_log(fs, root, clock)
    for _ in range(20):
        cl.put_message(rec(body=b"c" * 500), 1)
    assert cl.delete_expired_file(0, 0, 0, True, clock(), lambda ms: None) >= 1
    assert cl.get_min_offset() > 0
    assert messages(cl, cl.get_min_offset()) and messages(cl, 0) == []  # nothing read below the first
    assert cl.next_queue_offsets(0, cl.get_max_offset()) == {"TopicA-0": 20}
    assert cl.next_queue_offsets(cl.get_min_offset(), cl.get_max_offset()) == {"TopicA-0": 20}


def test_a_segment_kept_as_a_store_copy_is_a_hole_in_the_facts_a_restart_loads(tmp_path: Any, clock: Any) -> None:
    """Review 142 F2's residue: a writer restarted after the running store saved the copy of
    its deleted head segment loaded a log starting at the next one, and the queues' owner wrote
    filler units over the deleted segment's queue offsets (59 of them, 1 run in ~12): the copy
    moved back served none. Its range is a hole, for which nothing is given up."""
    from mqstore.storage.recovery import log_facts_of

    path = str(tmp_path / "commitlog")
    os.makedirs(path)
    for offset in (8192, 16384):
        with open(os.path.join(path, segment_file_name(offset)), "wb") as f:
            f.truncate(8192)
    with open(os.path.join(path, segment_file_name(0) + ".store-copy"), "wb") as f:
        f.truncate(8192)
    cl = CommitLog(RealFileSystem(), path, mapped_file_size=8192, clock_ms=clock)
    assert cl.load()
    facts = log_facts_of(cl, 16384, scan_start=16384, lost_ranges=(), quarantined=())
    assert facts.holes == ((0, 8192),)
    # And the head counts it (review 143 F1): the cleaner deletes queue and index files below
    # the head, and those of the copied segment must be there when the copy is moved back.
    assert cl.head_offset() == 0 and facts.min_offset == 0
    with open(os.path.join(path, "notes.store-copy"), "wb"):
        pass  # a stray name: not the store's, no hole (the open names it)
    assert log_facts_of(cl, 16384, scan_start=16384, lost_ranges=(), quarantined=()).holes == ((0, 8192),)
    os.rename(os.path.join(path, segment_file_name(0) + ".store-copy"), os.path.join(path, segment_file_name(24576) + ".store-copy"))
    assert log_facts_of(cl, 16384, scan_start=16384, lost_ranges=(), quarantined=()).holes == ((24576, 32768),)
    cl.shutdown()
