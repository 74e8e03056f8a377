"""CommitLog.append_fast: the writer's one-frame append gives the bytes, offsets and msgIds
of put_message(s), and declines (None, nothing written) whenever the checked path must decide."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.storage import speedups
from mqstore.storage.codec import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    HostAddress,
    encode_message,
    segment_file_name,
)
from mqstore.storage.commitlog import CommitLog, EncodedRecords
from mqstore.storage.fs import FileSystem, SimulatedFileSystem
from mqstore.storage.mapped_file import TransientStorePool
from mqstore.storage.status import PutMessageStatus

pytestmark = pytest.mark.skipif(speedups.native is None, reason="append_fast needs the C extension (_native)")

SEG = 4096
BORN = HostAddress("10.0.0.2", 5555)
BORN_V6 = HostAddress("fe80::1", 5555)
STORE = HostAddress("192.168.1.10", 10911)
NOW_MS = 1_700_000_000_000

# What a put gives its caller either way: (status, wrote offset, wrote bytes, queue offset, msgIds, store ts, msgs).
Outcome = tuple[PutMessageStatus, int, int, int, str, int, int]


def make_log(fs: FileSystem, root: str, *, fast: bool, size: int = SEG, **kw: Any) -> CommitLog:
    return CommitLog(fs, os.path.join(root, "commitlog"), mapped_file_size=size, clock_ms=lambda: NOW_MS,
                     fast_append=fast, **kw)  # fmt: skip


def records(queue_id: int, bodies: list[bytes], sys_flag: int = 0, born: HostAddress = BORN) -> EncodedRecords:
    datas = tuple(
        encode_message(topic="T", queue_id=queue_id, body=b, properties="TAGS\x01t\x02", sys_flag=sys_flag,
                       born_timestamp=1, born_host=born, store_host=STORE)  # fmt: skip
        for b in bodies
    )
    return EncodedRecords(datas, "T", queue_id, sys_flag, STORE)


def put(cl: CommitLog, r: EncodedRecords, batch: bool, now_ms: int) -> tuple[Outcome, bool]:
    """As the writer puts: append_fast first, the checked path when it declines. (outcome, fast?)"""
    fast = cl.append_fast(r.datas, r.queue_key, r.sys_flag, r.store_host, now_ms)
    if fast is not None:
        offset, size, queue_offset, ids = fast
        return (PutMessageStatus.PUT_OK, offset, size, queue_offset, ids, now_ms, len(r.datas)), True
    outcome = cl.put_messages(r, now_ms) if batch else cl.put_message(r, now_ms)
    a = outcome.append_result
    if outcome.status is not PutMessageStatus.PUT_OK or a is None:
        return (outcome.status, -1, 0, -1, "", 0, 0), False
    return (outcome.status, a.wrote_offset, a.wrote_bytes, a.logics_offset, a.msg_id, a.store_timestamp, a.msg_num), False


def segment_bytes(fs: FileSystem, cl: CommitLog) -> dict[str, bytes]:
    if not fs.isdir(cl.store_path):  # every put refused: no file was created
        return {}
    return {name: fs.read_bytes(os.path.join(cl.store_path, name)) for name in sorted(fs.listdir(cl.store_path))}


put_strategy = st.tuples(
    st.integers(0, 2),  # queue
    st.lists(st.integers(0, 700), min_size=1, max_size=4),  # body sizes (one record, or a batch)
    st.booleans(),  # batch
    st.sampled_from([0, 0, 0, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_COMMIT_TYPE]),
    st.booleans(),  # born host v6 (moves the store timestamp's field)
)


@settings(max_examples=60, deadline=None)
@given(puts=st.lists(put_strategy, min_size=1, max_size=40))
def test_fast_and_checked_paths_write_identical_bytes_and_results(puts: list[tuple[int, list[int], bool, int, bool]]) -> None:
    outcomes: dict[bool, list[Outcome]] = {}
    images: dict[bool, dict[str, bytes]] = {}
    tables: dict[bool, dict[str, int]] = {}
    for fast in (True, False):
        fast_taken = 0
        fs = SimulatedFileSystem(clock_ms=lambda: NOW_MS)
        fs.makedirs("/store")
        cl = make_log(fs, "/store", fast=fast)
        got = []
        for i, (queue_id, sizes, batch, sys_flag, v6) in enumerate(puts):
            batch = batch or len(sizes) > 1
            r = records(queue_id, [bytes([65 + i % 26]) * n for n in sizes], sys_flag, BORN_V6 if v6 else BORN)
            outcome, took_fast = put(cl, r, batch, NOW_MS + i)
            got.append(outcome)
            fast_taken += took_fast
        assert fast or not fast_taken, "append_fast wrote although the log was built without it"
        outcomes[fast], images[fast], tables[fast] = got, segment_bytes(fs, cl), dict(cl.topic_queue_table)
        cl.close()
    assert outcomes[True] == outcomes[False]
    assert images[True] == images[False]
    assert tables[True] == tables[False]


def test_the_fast_path_is_taken_for_plain_puts_into_the_checked_file(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, fast=True)
    first, took = put(cl, records(0, [b"a"]), False, NOW_MS)
    assert not took and first[0] is PutMessageStatus.PUT_OK  # nothing checked yet: the checked path
    second, took = put(cl, records(0, [b"b"]), False, NOW_MS + 1)
    assert took and second[1] == first[1] + first[2] and second[3] == 1
    third, took = put(cl, records(1, [b"c", b"d"]), True, NOW_MS + 2)
    assert took and third[3] == 0 and third[6] == 2 and len(third[4].split(",")) == 2
    assert cl.topic_queue_table == {"T-0": 2, "T-1": 2}
    assert cl.get_max_offset() == third[1] + third[2]
    assert cl.store_timestamp == NOW_MS + 2
    read = [r.record for r in cl.iter_records(0) if r.record is not None]
    assert [(m.queue_offset, m.commitlog_offset, m.store_timestamp) for m in read] == [
        (0, first[1], NOW_MS), (1, second[1], NOW_MS + 1), (0, third[1], NOW_MS + 2),
        (1, third[1] + third[2] // 2, NOW_MS + 2),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "why",
    ["transaction", "past_the_blank_room", "over_max_message_size", "reservation_short", "files_deleted",
     "truncated", "not_the_last_file"],
)  # fmt: skip
def test_each_fallback_condition_declines_and_writes_nothing(why: str, any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, fast=True, max_message_size=1500)
    assert put(cl, records(0, [b"x" * 100]), False, NOW_MS)[0][0] is PutMessageStatus.PUT_OK  # checks the file
    r = records(0, [b"y" * 100])
    if why == "transaction":
        r = records(0, [b"y" * 100], TRANSACTION_PREPARED_TYPE)
    elif why == "past_the_blank_room":
        while cl.get_max_offset() + len(r.datas[0]) + 8 <= SEG:
            assert put(cl, records(0, [b"z" * 100]), False, NOW_MS)[1]
    elif why == "over_max_message_size":
        r = records(0, [b"y" * 800, b"y" * 800])
    elif why == "reservation_short":
        # As on a nearly full disk, where the window shrank to the next put's own need.
        last = cl.mapped_file_queue.last_mapped_file
        assert last is not None
        last.reserved_until = last.wrote_position + 8
    elif why == "files_deleted":
        cl.delete_expired_file(72 * 3_600_000, 0, 0, False, NOW_MS, lambda ms: None)
    elif why == "truncated":
        cl.recover_tail(0, {}, check_crc=False)
    elif why == "not_the_last_file":
        cl.mapped_file_queue.get_last_mapped_file(0)  # as a roll-over would not leave it:
        last = cl.mapped_file_queue.last_mapped_file
        assert last is not None
        last.set_positions(SEG)
        cl.mapped_file_queue.get_last_mapped_file(0)
    before = segment_bytes(fs, cl)
    table = dict(cl.topic_queue_table)
    assert cl.append_fast(r.datas, r.queue_key, r.sys_flag, r.store_host, NOW_MS) is None
    assert segment_bytes(fs, cl) == before and cl.topic_queue_table == table


def test_a_degraded_log_never_takes_the_fast_path(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, fast=True)
    for i in range(30):  # several segments
        put(cl, records(0, [b"m" * 300]), False, NOW_MS + i)
    cl.close()
    names = sorted(fs.listdir(cl.store_path))
    assert len(names) >= 3
    fs.remove(os.path.join(cl.store_path, names[1]))  # a hole in the middle
    cl = make_log(fs, root, fast=True)
    assert cl.load()
    cl.recover_tail(0, {}, check_crc=False)
    assert cl.degraded_reason
    r = records(0, [b"n"])
    for _ in range(3):
        assert cl.append_fast(r.datas, r.queue_key, 0, STORE, NOW_MS) is None
        assert cl.put_message(r, NOW_MS).status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def test_write_buffers_or_an_owner_that_says_no_keep_the_checked_path(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    pooled = make_log(fs, root, fast=True, write_buffer_pool=TransientStorePool(2, SEG))
    off = make_log(fs, os.path.join(root, "other") if not isinstance(fs, SimulatedFileSystem) else "/store/other",
                   fast=False)  # fmt: skip
    for cl in (pooled, off):
        for i in range(3):
            outcome, took = put(cl, records(0, [b"w"]), False, NOW_MS + i)
            assert outcome[0] is PutMessageStatus.PUT_OK and not took
        cl.close()


def test_roll_over_goes_through_the_checked_path_and_then_the_new_file_is_fast(any_fs: tuple[FileSystem, str]) -> None:
    fs, root = any_fs
    cl = make_log(fs, root, fast=True)
    paths = []
    for i in range(20):
        paths.append(put(cl, records(0, [b"r" * 400]), False, NOW_MS + i)[1])
    # Per file: the first put (after the roll-over's blank) checked, the rest fast.
    assert sorted(fs.listdir(cl.store_path))[:2] == [segment_file_name(0), segment_file_name(SEG)]
    assert paths.count(False) == len(fs.listdir(cl.store_path))
    assert cl.topic_queue_table == {"T-0": 20}
