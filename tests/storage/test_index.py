"""IndexFile and IndexService against spec §10 and Appendix C."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.storage.codec import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    index_key_hash,
    java_string_hash,
)
from mqstore.storage.fs import RealFileSystem, SimulatedFileSystem
from mqstore.storage.index import (
    DEFAULT_MAX_HASH_SLOT_NUM,
    IndexFile,
    IndexService,
    index_file_name,
    index_file_name_after,
    index_file_name_to_ms,
    index_file_size,
    iter_index_entries,
    iter_index_slots,
    key_hash_and_slot,
    read_index_header,
    read_index_slot,
)

T0 = 1_700_000_000_123
INDEX_DIR = "/store/index"


class ManualClock:
    def __init__(self, now_ms: int = T0) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def make_service(
    fs: SimulatedFileSystem | RealFileSystem | None = None,
    *,
    index_dir: str = INDEX_DIR,
    slots: int = 11,
    entries: int = 64,
    clock: ManualClock | None = None,
    **kwargs: object,
) -> tuple[IndexService, SimulatedFileSystem | RealFileSystem, ManualClock]:
    clock = clock or ManualClock()
    fs = fs or SimulatedFileSystem(clock_ms=clock)
    service = IndexService(
        fs, index_dir, clock_ms=clock, max_hash_slot_num=slots, max_index_num=entries, **kwargs  # type: ignore[arg-type]
    )
    return service, fs, clock


def index_message(service: IndexService, offset: int, ts: int, *, keys: str | None = None,
                  uniq: str | None = None, topic: str = "abc", sys_flag: int = 0) -> bool:
    return service.build_index(topic=topic, commitlog_offset=offset, store_timestamp=ts,
                               sys_flag=sys_flag, keys=keys, uniq_key=uniq)


# ---------------------------------------------------------------------------------------
# Appendix C, byte for byte, with the default 5,000,000 slots (a sparse file on disk)


def test_appendix_c_entries_slots_and_header_bytes(tmp_path: object) -> None:
    fs = RealFileSystem()
    index_dir = os.path.join(str(tmp_path), "index")
    service, _, _ = make_service(fs, index_dir=index_dir, slots=DEFAULT_MAX_HASH_SLOT_NUM, entries=16)
    assert index_message(service, 1073742336, T0, uniq="7F00000130392A9F1A2B0000EA600001", keys="order-1 order-2")
    assert index_message(service, 1073742518, T0 + 65_000, uniq="7F00000130392A9F1A2B0000EA610002", keys="order-1")
    service.flush_all()
    (f,) = service.files
    data = open(f.path, "rb").read()
    assert len(data) == 40 + 5_000_000 * 4 + 16 * 20

    def at(pos: int, n: int) -> str:
        return data[pos : pos + n].hex(" ").upper()

    assert at(20000060, 20) == "06 1F 47 47 00 00 00 00 40 00 02 00 00 00 00 00 00 00 00 00"
    assert at(20000080, 20) == "31 12 0A 51 00 00 00 00 40 00 02 00 00 00 00 00 00 00 00 00"
    assert at(20000100, 20) == "31 12 0A 52 00 00 00 00 40 00 02 00 00 00 00 00 00 00 00 00"
    assert at(20000140, 20) == "31 12 0A 51 00 00 00 00 40 00 02 B6 00 00 00 41 00 00 00 02"
    assert at(10852676, 4) == "00 00 00 01"
    assert at(13063532, 4) == "00 00 00 05"  # head insertion: slot -> 5 -> 2 -> end
    assert at(13063536, 4) == "00 00 00 03"
    assert at(0, 40) == (
        "00 00 01 8B CF E5 68 7B 00 00 01 8B CF E6 66 63 00 00 00 00 40 00 02 00 "
        "00 00 00 00 40 00 02 B6 00 00 00 05 00 00 00 06"
    )
    e4 = f.entry(4)
    assert (e4.key_hash, e4.time_diff, e4.prev_index) == (103636681, 65, 0)
    assert f.slot_value(3636681) == 4
    result = service.query_offset("abc", "order-1", 32, 0, T0 + 3_600_000)
    assert result.phy_offsets == [1073742518, 1073742336]  # chain order, newest first
    assert (result.index_last_update_timestamp, result.index_last_update_phy_offset) == (T0 + 65_000, 1073742518)
    service.close()


def test_appendix_c_hashes_and_slots() -> None:
    cases = {
        "abc#7F00000130392A9F1A2B0000EA600001": (102713159, 2713159),
        "abc#order-1": (823265873, 3265873),
        "abc#order-2": (823265874, 3265874),
        "abc#7F00000130392A9F1A2B0000EA610002": (103636681, 3636681),
        "abc#hello": (1462968975, 2968975),  # Java hashCode -1462968975
        "polygenelubricants": (0, 0),  # hashCode Integer.MIN_VALUE: Math.abs overflows
    }
    for key, expected in cases.items():
        assert key_hash_and_slot(key, DEFAULT_MAX_HASH_SLOT_NUM) == expected, key
    assert java_string_hash("polygenelubricants") == -(2**31)


@given(st.text(max_size=80) | st.text(alphabet="abcXYZ#09-_", max_size=600))
def test_fast_key_hash_equals_codec_index_key_hash(key: str) -> None:
    key_hash, slot = key_hash_and_slot(key, 5_000_000)
    assert key_hash == index_key_hash(key)
    assert slot == key_hash % 5_000_000


def test_integer_min_value_hash_key_goes_to_slot_zero_with_key_hash_zero() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/i")
    f = IndexFile.create(fs, "/i/20240101000000000", max_hash_slot_num=7, max_index_num=8)
    assert f.put_key("polygenelubricants", 4242, T0)
    assert f.slot_value(0) == 1
    assert f.entry(1).key_hash == 0
    assert f.select_phy_offset("polygenelubricants", 10, 0, T0) == [4242]


# ---------------------------------------------------------------------------------------
# IndexFile


def new_file(fs: SimulatedFileSystem, *, slots: int = 11, entries: int = 32, **kwargs: int) -> IndexFile:
    fs.makedirs("/i")
    return IndexFile.create(fs, "/i/20240101000000000", max_hash_slot_num=slots, max_index_num=entries, **kwargs)


def test_fresh_file_has_zero_header_on_disk_and_index_count_one_in_memory() -> None:
    fs = SimulatedFileSystem()
    f = new_file(fs)
    assert fs.read_bytes(f.path)[:40] == bytes(40)
    assert f.index_count == 1 and f.hash_slot_count == 0
    assert f.file_size == index_file_size(11, 32) == 40 + 44 + 640
    assert f.select_phy_offset("k", 10, 0, 2**62) == []


def test_head_insertion_links_each_entry_to_the_previous_head() -> None:
    f = new_file(SimulatedFileSystem())
    for i in range(5):
        assert f.put_key("t#k", 100 * i, T0 + i)
    _, slot = key_hash_and_slot("t#k", 11)
    assert f.slot_value(slot) == 5
    assert [f.entry(n).prev_index for n in range(1, 6)] == [0, 1, 2, 3, 4]
    assert f.select_phy_offset("t#k", 10, 0, 2**62) == [400, 300, 200, 100, 0]
    assert f.select_phy_offset("t#k", 2, 0, 2**62) == [400, 300]  # max_num stops the walk
    assert (f.hash_slot_count, f.index_count) == (5, 6)  # 4.4.0: hashSlotCount counts every put


def test_slot_collision_returns_only_matching_hashes_and_same_hash_keys_both() -> None:
    f = new_file(SimulatedFileSystem(), slots=1)  # every key in slot 0
    f.put_key("t#a", 1, T0)
    f.put_key("t#b", 2, T0)
    f.put_key("t#Aa", 3, T0)
    f.put_key("t#BB", 4, T0)  # "Aa" and "BB" share a Java hash, so these keys do too
    assert f.select_phy_offset("t#a", 10, 0, 2**62) == [1]
    assert f.select_phy_offset("t#b", 10, 0, 2**62) == [2]
    assert f.select_phy_offset("t#Aa", 10, 0, 2**62) == [4, 3]  # readers must compare keys
    assert f.select_phy_offset("t#zz", 10, 0, 2**62) == []


def test_time_diff_is_truncated_seconds_and_filtering_uses_the_second_precision_time() -> None:
    f = new_file(SimulatedFileSystem())
    f.put_key("t#k", 10, T0)  # timeDiff 0, begin := T0
    f.put_key("t#k", 20, T0 + 1_999)  # 1 s (truncated)
    f.put_key("t#k", 30, T0 + 10_500)  # 10 s
    f.put_key("t#k", 40, T0 - 5_000)  # negative clamps to 0
    assert [f.entry(n).time_diff for n in range(1, 5)] == [0, 1, 10, 0]
    # Chain newest first: 4 (reads T0), 3 (T0+10 s), 2 (T0+1 s), 1 (T0).
    assert f.select_phy_offset("t#k", 10, T0 + 1_000, T0 + 1_000) == []  # entry 4 is older than begin: stop
    assert f.select_phy_offset("t#k", 10, T0, T0 + 1_000) == [40, 20, 10]  # 3 is out of range, walk on
    assert f.select_phy_offset("t#k", 10, T0 + 10_000, T0 + 20_000) == []


def test_walk_stops_at_the_first_entry_older_than_begin() -> None:
    f = new_file(SimulatedFileSystem())
    f.put_key("t#k", 10, T0)
    f.put_key("t#k", 20, T0 + 5_000)
    f.put_key("t#k", 30, T0 + 9_000)
    # Newest first: 30 (9 s) in, 20 (5 s) in, 10 (0 s) out and older than begin.
    assert f.select_phy_offset("t#k", 10, T0 + 5_000, T0 + 9_000) == [30, 20]
    assert f.select_phy_offset("t#k", 10, T0 + 6_000, T0 + 9_000) == [30]


def test_time_clamped_to_integer_max() -> None:
    f = new_file(SimulatedFileSystem())
    f.put_key("t#k", 10, 1_000)
    f.put_key("t#k", 20, 1_000 + (2**31) * 1_000 + 5_000)
    assert f.entry(2).time_diff == 2**31 - 1


def test_first_entry_after_a_full_file_measures_time_from_the_previous_end() -> None:
    fs = SimulatedFileSystem()
    f = new_file(fs, end_phy_offset=5_000, end_timestamp=T0)
    header = read_index_header(fs, f.path)
    assert (header.begin_timestamp, header.end_timestamp) == (T0, T0)
    assert (header.begin_phy_offset, header.end_phy_offset) == (5_000, 5_000)
    assert header.index_count == 0  # as Java: counts are written at the first put
    assert f.put_key("t#k", 6_000, T0 + 7_900)
    assert f.entry(1).time_diff == 7  # against the pre-set begin (the quirk)
    assert (f.begin_timestamp, f.begin_phy_offset) == (T0 + 7_900, 6_000)
    # RocketMQ reads it back against the new begin (T0 + 7.9 s + 7 s, later than it was stored
    # by the gap: review 127 F4); the store time of entry 1 is the begin itself.
    assert f.select_phy_offset("t#k", 10, T0 + 14_900, T0 + 14_900) == []
    assert f.select_phy_offset("t#k", 10, T0 + 7_900, T0 + 7_900) == [6_000]


def test_full_file_refuses_puts_and_usable_capacity_is_max_index_num_minus_one() -> None:
    f = new_file(SimulatedFileSystem(), entries=4)
    assert all(f.put_key(f"t#{i}", i, T0) for i in range(3))
    assert f.is_write_full()
    assert not f.put_key("t#x", 99, T0)
    assert f.index_count == 4


def test_is_time_matched() -> None:
    f = new_file(SimulatedFileSystem())
    f.put_key("t#a", 1, 1_000)
    f.put_key("t#a", 2, 2_000)
    assert f.is_time_matched(0, 3_000)  # covers the file
    assert f.is_time_matched(1_500, 5_000)  # begin inside
    assert f.is_time_matched(0, 1_000)  # end inside
    assert not f.is_time_matched(2_001, 3_000)
    assert not f.is_time_matched(0, 999)


def test_load_treats_non_positive_index_count_as_one() -> None:
    fs = SimulatedFileSystem()
    f = new_file(fs)
    struct.pack_into(">i", f._region.buf, 36, -5)
    f2 = IndexFile.load(fs, f.path, max_hash_slot_num=11, max_index_num=32)
    assert f2.index_count == 1


def test_read_only_helpers_for_tools() -> None:
    fs = SimulatedFileSystem()
    f = new_file(fs, slots=5, entries=10)
    f.put_key("t#a", 100, T0)
    f.put_key("t#b", 200, T0 + 3_000)
    f.put_key("t#a", 300, T0 + 4_000)
    f.flush()
    header = read_index_header(fs, f.path)
    assert (header.begin_phy_offset, header.end_phy_offset, header.index_count) == (100, 300, 4)
    entries = list(iter_index_entries(fs, f.path, max_hash_slot_num=5))
    ha, slot_a = key_hash_and_slot("t#a", 5)
    hb, slot_b = key_hash_and_slot("t#b", 5)
    assert [(e.entry_no, e.key_hash, e.phy_offset, e.time_diff, e.prev_index) for e in entries] == [
        (1, ha, 100, 0, 0),
        (2, hb, 200, 3, 0 if slot_b != slot_a else 1),
        (3, ha, 300, 4, 2 if slot_b == slot_a else 1),
    ]
    slots = dict(iter_index_slots(fs, f.path, max_hash_slot_num=5))
    assert slots[slot_a] == 3
    assert read_index_slot(fs, f.path, slot_a, max_hash_slot_num=5) == 3
    with pytest.raises(ValueError):
        IndexFile.open_readonly(fs, f.path, max_hash_slot_num=6)


def test_read_only_helpers_on_a_real_sparse_file(tmp_path: object) -> None:
    fs = RealFileSystem()
    path = os.path.join(str(tmp_path), "20240101000000000")
    f = IndexFile.create(fs, path, max_index_num=8)
    f.put_key("abc#order-1", 77, T0)
    f.flush()
    f.close()
    assert read_index_header(fs, path).end_phy_offset == 77
    assert [e.phy_offset for e in iter_index_entries(fs, path)] == [77]
    assert list(iter_index_slots(fs, path)) == [(3265873, 1)]


# ---------------------------------------------------------------------------------------
# IndexService: build_index


def test_build_index_indexes_uniq_key_first_then_keys_with_java_split() -> None:
    service, _, _ = make_service()
    assert index_message(service, 100, T0, uniq="U1", keys=" a  b c ")
    f = service.files[0]
    # " a  b c " splits to ["", "a", "", "b", "c"]; empties are skipped.
    hashes = [e.key_hash for e in f.iter_entries()]
    assert hashes == [key_hash_and_slot(f"abc#{k}", 11)[0] for k in ["U1", "a", "b", "c"]]
    for k in ["U1", "a", "b", "c"]:
        assert service.query_offset("abc", k, 10, 0, T0).phy_offsets == [100]


def test_build_index_skips_already_indexed_offsets_but_reindexes_the_end_offset() -> None:
    service, _, _ = make_service()
    index_message(service, 100, T0, keys="a")
    index_message(service, 200, T0, keys="b")
    assert index_message(service, 150, T0, keys="c")  # below endPhyOffset 200: skipped
    assert service.query_offset("abc", "c", 10, 0, T0).phy_offsets == []
    # == endPhyOffset: indexed again (4.4.0 `<`), but idempotently (issue 14): a key already
    # there with this offset is skipped, a missing one (its file dropped at recovery) added.
    index_message(service, 200, T0, keys="b d")
    assert service.query_offset("abc", "b", 10, 0, T0).phy_offsets == [200]
    assert service.query_offset("abc", "d", 10, 0, T0).phy_offsets == [200]


def test_resume_offset_is_the_newest_files_end_phy_offset() -> None:
    service, _, _ = make_service()
    assert service.resume_offset() == 0
    index_message(service, 100, T0, keys="a")
    index_message(service, 200, T0, keys="b")
    assert service.resume_offset() == 200


def test_rollback_messages_are_not_indexed_and_other_transaction_types_are() -> None:
    service, _, _ = make_service()
    index_message(service, 100, T0, keys="p", sys_flag=TRANSACTION_PREPARED_TYPE)
    index_message(service, 200, T0, keys="c", sys_flag=TRANSACTION_COMMIT_TYPE)
    index_message(service, 300, T0, keys="r", sys_flag=TRANSACTION_ROLLBACK_TYPE)
    assert service.query_offset("abc", "p", 10, 0, T0).phy_offsets == [100]
    assert service.query_offset("abc", "c", 10, 0, T0).phy_offsets == [200]
    assert service.query_offset("abc", "r", 10, 0, T0).phy_offsets == []


def test_full_file_rolls_flushes_and_reports_its_end_timestamp() -> None:
    reported: list[int] = []
    service, fs, clock = make_service(entries=4, on_index_file_full=reported.append)
    index_message(service, 100, T0, keys="a b c")  # three entries: the file is full
    assert len(service.files) == 1 and service.files[0].is_write_full()
    clock.now_ms += 1_000
    index_message(service, 200, T0 + 2_500, keys="d")
    first, second = service.files
    assert first.name < second.name == index_file_name(T0 + 1_000)
    assert reported == [T0]
    assert fs.crash(seed=1, tear=False).read_bytes(first.path) == fs.read_bytes(first.path)  # forced
    # The new file started from the previous end; its first entry measured time from it.
    assert (second.begin_phy_offset, second.begin_timestamp) == (200, T0 + 2_500)
    assert second.entry(1).time_diff == 2
    assert service.query_offset("abc", "a", 10, 0, 2**62).phy_offsets == [100]


def test_keys_of_one_message_continue_in_the_next_file_when_one_fills_up() -> None:
    service, _, _ = make_service(entries=3)  # two usable entries per file
    index_message(service, 100, T0, uniq="u", keys="a b c")
    assert len(service.files) == 2
    for k in ["u", "a", "b", "c"]:
        assert service.query_offset("abc", k, 10, 0, T0).phy_offsets == [100], k


def test_new_file_names_never_collide_even_with_a_stopped_clock() -> None:
    service, fs, clock = make_service(entries=2)  # one entry per file
    for i in range(4):
        index_message(service, 100 * (i + 1), T0, keys=f"k{i}")
    names = [f.name for f in service.files]
    assert names == sorted(names) and len(set(names)) == 4
    assert [index_file_name_to_ms(n) for n in names] == [T0, T0 + 1, T0 + 2, T0 + 3]
    clock.now_ms = T0 - 60_000  # the clock jumps back: names must still sort in creation order
    index_message(service, 1_000, T0, keys="late")
    assert service.files[-1].name > names[-1]


def test_the_name_after_an_index_file_name_counts_in_its_digits() -> None:
    assert index_file_name_after("20261101015959998") == "20261101015959999"
    assert index_file_name_after("20261101015959999") == "20261101020000000"
    assert index_file_name_after("20261231235959999") == "20270101000000000"
    assert index_file_name_after("20280228235959999") == "20280229000000000"


def test_a_dst_fall_back_does_not_keep_the_index_from_starting_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 57 F7: the last file named at 01:50 EDT, the next needed at 01:20 EST (30 min
    later): the clock's names sort below the last one for an hour, and counting on from the
    last name through mktime (which read it as EST, an hour later than it was) stayed below
    it for all 1,000 tries; no file could be made, and every key waited."""
    import calendar
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        edt_0150 = calendar.timegm((2026, 11, 1, 5, 50, 0, 0, 0, 0)) * 1000
        service, _fs, clock = make_service(entries=2, clock=ManualClock(edt_0150))  # one entry per file
        index_message(service, 100, edt_0150, keys="a")
        assert [f.name for f in service.files] == ["20261101015000000"]
        clock.now_ms = edt_0150 + 30 * 60_000  # 01:20 EST
        assert index_message(service, 200, clock.now_ms, keys="b")
        assert [f.name for f in service.files] == ["20261101015000000", "20261101015000001"]
        assert service.query_offset("abc", "b", 10, 0, 2**62).phy_offsets == [200]
    finally:
        monkeypatch.undo()
        time.tzset()


def test_index_file_name_is_17_digit_local_time() -> None:
    name = index_file_name(T0)
    assert len(name) == 17 and name.isdigit() and name.endswith("123")
    assert index_file_name_to_ms(name) == T0


def test_creation_failing_three_times_sets_index_error() -> None:
    sleeps: list[int] = []
    service, fs, _ = make_service(sleep_ms=sleeps.append)
    fs.inject_fault("map", path_contains="/index/", count=3)
    assert not index_message(service, 100, T0, keys="a")
    assert service.index_error
    assert sleeps == [1000, 1000]
    assert service.files == []


def test_creation_failing_twice_then_succeeding_is_fine() -> None:
    service, fs, _ = make_service()
    fs.inject_fault("map", path_contains="/index/", count=2)
    assert index_message(service, 100, T0, keys="a")
    assert not service.index_error


# ---------------------------------------------------------------------------------------
# IndexService: query across files


def fill_files(service: IndexService, clock: ManualClock, times: list[int], key: str = "k") -> None:
    """One message per timestamp, with `entries=2` that is one file each."""
    for i, ts in enumerate(times):
        clock.now_ms = ts
        index_message(service, 1_000 * (i + 1), ts, keys=key)


def test_query_walks_files_newest_first() -> None:
    service, _, clock = make_service(entries=2)
    fill_files(service, clock, [T0, T0 + 10_000, T0 + 20_000])
    assert len(service.files) == 3
    r = service.query_offset("abc", "k", 10, 0, T0 + 30_000)
    assert r.phy_offsets == [3_000, 2_000, 1_000]
    assert (r.index_last_update_timestamp, r.index_last_update_phy_offset) == (T0 + 20_000, 3_000)


def test_query_stops_at_the_first_file_that_begins_before_begin() -> None:
    service, _, clock = make_service(entries=2)
    fill_files(service, clock, [T0, T0 + 10_000, T0 + 20_000])
    # The middle file begins before `begin`: it is searched, the oldest is not.
    r = service.query_offset("abc", "k", 10, T0 + 10_001, T0 + 30_000)
    assert r.phy_offsets == [3_000]
    r = service.query_offset("abc", "k", 10, T0 + 10_000, T0 + 30_000)
    assert r.phy_offsets == [3_000, 2_000]


def test_query_stops_when_max_num_is_reached_and_max_num_is_capped() -> None:
    service, _, clock = make_service(entries=2)
    fill_files(service, clock, [T0, T0 + 10_000, T0 + 20_000])
    assert service.query_offset("abc", "k", 2, 0, 2**62).phy_offsets == [3_000, 2_000]
    big, _, _ = make_service(entries=200, max_msgs_num_batch=64)
    for i in range(100):
        index_message(big, i + 1, T0, keys="hot")
    assert len(big.query_offset("abc", "hot", 1_000, 0, 2**62).phy_offsets) == 64


def test_query_on_an_empty_service() -> None:
    service, _, _ = make_service()
    assert service.query_offset("abc", "k", 10, 0, 2**62) == ([], 0, 0)


# ---------------------------------------------------------------------------------------
# Deletion, load, recovery support


def test_delete_expired_file_removes_old_files_but_never_the_newest() -> None:
    service, fs, clock = make_service(entries=2)
    fill_files(service, clock, [T0, T0 + 10_000, T0 + 20_000])
    paths = [f.path for f in service.files]
    assert service.delete_expired_file(1_000) == 0  # endPhyOffset 1000 is not < 1000
    assert service.delete_expired_file(2_500) == 2  # the files ending at 1000 and 2000
    assert [f.path for f in service.files] == paths[2:]
    assert not fs.exists(paths[0]) and not fs.exists(paths[1])
    assert service.delete_expired_file(10**9) == 0  # the newest stays
    assert fs.exists(paths[2])


def test_delete_expired_file_stops_at_the_first_failure() -> None:
    service, fs, clock = make_service(entries=2)
    fill_files(service, clock, [T0, T0 + 10_000, T0 + 20_000])
    fs.inject_fault("remove", path_contains=service.files[1].name)
    assert service.delete_expired_file(10**9) == 1
    assert len(service.files) == 2


def test_load_after_clean_exit_keeps_every_file() -> None:
    service, fs, clock = make_service(entries=2)
    fill_files(service, clock, [T0, T0 + 10_000, T0 + 20_000])
    service.flush_all()
    reloaded, _, _ = make_service(fs, entries=2)
    assert reloaded.load(last_exit_ok=True, index_msg_timestamp=0)
    assert [f.name for f in reloaded.files] == [f.name for f in service.files]
    assert reloaded.query_offset("abc", "k", 10, 0, 2**62).phy_offsets == [3_000, 2_000, 1_000]


def test_load_after_abnormal_exit_deletes_files_newer_than_the_checkpoint() -> None:
    reported: list[int] = []
    service, fs, clock = make_service(entries=2, on_index_file_full=reported.append)
    fill_files(service, clock, [T0, T0 + 10_000, T0 + 20_000])
    assert reported == [T0, T0 + 10_000]
    after = fs.crash(seed=7)
    reloaded, _, _ = make_service(after, entries=2)
    assert reloaded.load(last_exit_ok=False, index_msg_timestamp=reported[-1])
    assert [f.end_timestamp for f in reloaded.files] == [T0, T0 + 10_000]
    assert len(after.listdir(INDEX_DIR)) == 2


def test_load_refuses_files_of_another_geometry_and_skips_foreign_names() -> None:
    """Files that hold together at another max_index_num (one of them full: a writer of that
    geometry rolled over) are not damage: refused, nothing renamed (issue 19)."""
    service, fs, clock = make_service(entries=2)
    fill_files(service, clock, [T0, T0 + 10_000, T0 + 20_000])
    fs.write_atomic(INDEX_DIR + "/notes.txt", b"x")
    fs.makedirs(INDEX_DIR + "/20990101000000000")  # a directory with a file's name: ignored
    ok, _, _ = make_service(fs, entries=2)
    assert ok.load(True, 0) and len(ok.files) == 3
    ok.close()
    before = fs.listdir(INDEX_DIR)
    wrong, _, _ = make_service(fs, entries=3)
    assert not wrong.load(True, 0)
    assert fs.listdir(INDEX_DIR) == before


@pytest.mark.parametrize("damage", ["empty", "short", "longer", "header_only"])
def test_a_damaged_index_file_is_set_aside_and_later_files_dropped(damage: str) -> None:
    """Issue 19 item 6: an index file of a size its siblings do not share is kept as
    `.damaged` (never deleted), later files go, and the caller re-dispatches (the service
    loads what is left instead of failing the open)."""
    service, fs, clock = make_service(entries=2)
    fill_files(service, clock, [T0, T0 + 10_000, T0 + 20_000])
    names = sorted(fs.listdir(INDEX_DIR))
    service.close()
    middle = f"{INDEX_DIR}/{names[1]}"
    data = fs.read_bytes(middle)
    bad = {"empty": b"", "short": data[: len(data) // 2 + 3], "longer": data + b"\0" * 20,
           "header_only": data[:40]}[damage]  # fmt: skip
    fs.write_atomic(middle, bad)
    reloaded, _, _ = make_service(fs, entries=2)
    assert reloaded.load(True, 0)
    assert [f.name for f in reloaded.files] == [names[0]]
    assert sorted(fs.listdir(INDEX_DIR)) == [names[0], names[1] + ".damaged"]
    assert fs.read_bytes(middle + ".damaged") == bad
    assert len(reloaded.set_aside) == 2 and names[1] in reloaded.set_aside[0]


def test_a_lone_index_file_cut_short_is_set_aside() -> None:
    service, fs, _ = make_service()
    index_message(service, 100, T0, keys="a")
    name = fs.listdir(INDEX_DIR)[0]
    service.close()
    fs.write_atomic(f"{INDEX_DIR}/{name}", fs.read_bytes(f"{INDEX_DIR}/{name}")[:1000])
    reloaded, _, _ = make_service(fs)
    assert reloaded.load(True, 0) and reloaded.files == []
    assert fs.listdir(INDEX_DIR) == [name + ".damaged"]


def test_load_of_a_missing_directory_is_an_empty_index() -> None:
    service, _, _ = make_service()
    assert service.load(False, 0) and service.files == []


def test_flush_all_makes_the_current_file_durable() -> None:
    service, fs, _ = make_service()
    index_message(service, 100, T0, keys="a")
    service.flush_all()
    after = fs.crash(seed=3)
    reloaded, _, _ = make_service(after)
    assert reloaded.load(True, 0)
    assert reloaded.query_offset("abc", "a", 10, 0, T0).phy_offsets == [100]


def test_drop_files_after_undoes_entries_past_the_offset_so_new_messages_get_indexed() -> None:
    service, _, _ = make_service(slots=3, entries=64)
    for i in range(10):
        index_message(service, 100 * (i + 1), T0 + i * 1_000, keys=f"k{i % 4} all")
    (f,) = service.files
    assert service.drop_files_after(650) == 0
    assert f.end_phy_offset == 600 and f.index_count == 13
    assert f.end_timestamp == T0 + 5_000
    assert service.query_offset("abc", "all", 64, 0, 2**62).phy_offsets == [600, 500, 400, 300, 200, 100]
    assert service.query_offset("abc", "k2", 64, 0, 2**62).phy_offsets == [300]
    index_message(service, 650, T0 + 20_000, keys="k2")  # not skipped as "already indexed"
    assert service.query_offset("abc", "k2", 64, 0, 2**62).phy_offsets == [650, 300]
    assert sorted(e.entry_no for e in f.iter_entries()) == list(range(1, 14))


def test_drop_files_after_deletes_newer_files_and_emptied_files() -> None:
    service, fs, clock = make_service(entries=3)  # two entries per file
    fill_files(service, clock, [T0, T0 + 1_000, T0 + 2_000, T0 + 3_000, T0 + 4_000])
    assert [f.begin_phy_offset for f in service.files] == [1_000, 3_000, 5_000]
    assert service.drop_files_after(2_000) == 2
    (f,) = service.files
    assert f.end_phy_offset == 1_000 and f.index_count == 2
    assert service.drop_files_after(1_000) == 1 and service.files == []
    assert fs.listdir(INDEX_DIR) == []


def test_drop_files_after_deletes_a_file_whose_chains_are_torn() -> None:
    service, _, _ = make_service(slots=3)
    for i in range(4):
        index_message(service, 100 * (i + 1), T0, keys="a")
    f = service.files[0]
    _, slot = key_hash_and_slot("abc#a", 3)
    struct.pack_into(">i", f._region.buf, 40 + slot * 4, 2)  # a slot page that missed writeback
    assert service.drop_files_after(350) == 1
    assert service.files == []


def test_destroy_deletes_everything() -> None:
    service, fs, clock = make_service(entries=2)
    fill_files(service, clock, [T0, T0 + 1_000])
    service.destroy()
    assert service.files == [] and fs.listdir(INDEX_DIR) == []


# ---------------------------------------------------------------------------------------
# Property: whatever is put is found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    keys=st.lists(st.text(min_size=1, max_size=12).filter(lambda s: " " not in s), min_size=1, max_size=40),
    slots=st.integers(min_value=1, max_value=17),
    entries=st.integers(min_value=2, max_value=9),
)
def test_every_put_key_is_found_with_its_offsets(keys: list[str], slots: int, entries: int) -> None:
    service, _, clock = make_service(slots=slots, entries=entries)
    expected: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        offset = 100 * (i + 1)
        clock.now_ms = T0 + i
        assert index_message(service, offset, T0 + i * 500, keys=k)
        expected.setdefault(k, []).append(offset)
    for k, offsets in expected.items():
        found = service.query_offset("abc", k, 64, 0, 2**62).phy_offsets
        # Every offset of the key, newest first; a key with the same hash adds its own offsets.
        assert [o for o in found if o in offsets] == sorted(offsets, reverse=True)
        same_hash = {
            o
            for other, other_offsets in expected.items()
            if index_key_hash(f"abc#{other}") == index_key_hash(f"abc#{k}")
            for o in other_offsets
        }
        assert set(found) <= same_hash


def test_an_io_error_reserving_blocks_refuses_the_entry_and_a_later_one_goes_in() -> None:
    """Review 48 M1: an error other than ENOSPC left the file sparse for good, and entries went
    into pages no block backed (a SIGBUS without the guard). Now the entry waits, as on a full
    disk, and goes in once reserving works again."""
    import errno

    from mqstore.storage.mapped_file import DiskFullError

    fs = SimulatedFileSystem()
    f = new_file(fs, entries=400_000)
    fs.inject_fault("reserve", path_contains="", err=errno.EIO, count=1_000_000)
    with pytest.raises(DiskFullError):
        for i in range(400_000):  # past what the first reservation covered
            assert f.put_key(f"k{i}", 100 + i, 1_000 + i)
    stored = f.index_count
    fs.clear_faults()
    assert f.put_key("after", 99_999, 5_000) and f.index_count == stored + 1
