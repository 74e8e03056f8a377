"""ConsumerOffsetStore, fastjson parsing and the string2File protocol (spec §11.10)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.storage.consumer_offsets import (
    ConsumerOffsetStore,
    load_delay_offsets,
    load_fastjson,
)
from mqstore.storage.fs import RealFileSystem, SimulatedFileSystem

FIXTURE_CONFIG = Path("/work/shared/fixtures/broker-sample-c/config")
GROUP = "please_rename_unique_group_name_4"
PATH = "/store/config/consumerOffset.json"


def copy_fixture_root(tmp_path: Path) -> Path:
    config = tmp_path / "config"
    config.mkdir()
    for name in ("consumerOffset.json", "delayOffset.json"):
        shutil.copyfile(FIXTURE_CONFIG / name, config / name)
    return tmp_path


def test_fixture_consumer_offsets_with_bare_integer_keys(tmp_path: Path) -> None:
    root = copy_fixture_root(tmp_path)
    store = ConsumerOffsetStore(RealFileSystem(), str(root))
    assert store.load()
    assert store.table() == {
        f"TopicTest@{GROUP}": {0: 250, 1: 250, 2: 250, 3: 250},
        f"%RETRY%{GROUP}@{GROUP}": {0: 0},
    }
    assert store.query_offset(GROUP, "TopicTest", 3) == 250
    assert store.query_offset(GROUP, "TopicTest", 4) == -1
    assert store.query_all(GROUP, f"%RETRY%{GROUP}") == {0: 0}
    assert store.groups_of_topic("TopicTest") == [GROUP]


def test_fixture_delay_offsets(tmp_path: Path) -> None:
    root = copy_fixture_root(tmp_path)
    assert load_delay_offsets(RealFileSystem(), str(root)) == {}
    assert load_delay_offsets(RealFileSystem(), str(tmp_path / "nowhere")) is None


def test_load_fastjson_quotes_keys_but_never_string_contents() -> None:
    text = '{"offsetTable":{"a{0:1}, 2:3@g":{0:250,\n\t-1 :7},"arr":[1, 2 ,3],"s":"x,4:5"}}'
    assert load_fastjson(text) == {
        "offsetTable": {"a{0:1}, 2:3@g": {"0": 250, "-1": 7}, "arr": [1, 2, 3], "s": "x,4:5"}
    }
    assert load_fastjson('{"e":"quote \\" {1:2}"}') == {"e": 'quote " {1:2}'}
    with pytest.raises(ValueError):
        load_fastjson("{0:")


@given(st.dictionaries(st.text(max_size=8), st.dictionaries(st.integers(0, 10_000), st.integers(0, 2**62))))
def test_load_fastjson_reads_its_bare_key_form_and_strict_json(table: dict[str, dict[int, int]]) -> None:
    strict = json.dumps({"offsetTable": table})
    expected = json.loads(strict)
    assert load_fastjson(strict) == expected
    bare = "{" + ",".join(
        json.dumps(k) + ":{" + ",".join(f"{q}:{o}" for q, o in v.items()) + "}" for k, v in table.items()
    ) + "}"
    assert load_fastjson('{"offsetTable":' + bare + "}") == expected


def test_round_trip_writes_strict_json_in_rocketmq_shape() -> None:
    fs = SimulatedFileSystem()
    store = ConsumerOffsetStore(fs, "/store")
    assert not store.load()  # nothing yet: empty table
    store.commit_offset("g1", "TopicA", 0, 10)
    store.commit_offset("g1", "TopicA", 1, 11)
    store.commit_offset("g2", "TopicA", 0, 5)
    store.commit_offset("g1", "TopicA", 0, 12)
    store.persist()
    doc = json.loads(fs.read_bytes(PATH))  # strict JSON
    assert doc == {"offsetTable": {"TopicA@g1": {"0": 12, "1": 11}, "TopicA@g2": {"0": 5}}}
    again = ConsumerOffsetStore(fs, "/store")
    assert again.load()
    assert again.table() == store.table()
    assert sorted(again.groups_of_topic("TopicA")) == ["g1", "g2"]


def test_persist_keeps_the_previous_version_as_bak() -> None:
    fs = SimulatedFileSystem()
    store = ConsumerOffsetStore(fs, "/store")
    store.commit_offset("g", "T", 0, 1)
    store.persist()
    assert not fs.exists(PATH + ".bak")
    store.commit_offset("g", "T", 0, 2)
    store.persist()
    assert json.loads(fs.read_bytes(PATH + ".bak"))["offsetTable"]["T@g"] == {"0": 1}
    assert json.loads(fs.read_bytes(PATH))["offsetTable"]["T@g"] == {"0": 2}


@pytest.mark.parametrize("damage", [b"", b"{\"offsetTable\":{\"T@g\":{0:", b"\xff\xfe"])
def test_corrupt_or_empty_main_file_falls_back_to_bak(damage: bytes) -> None:
    fs = SimulatedFileSystem()
    store = ConsumerOffsetStore(fs, "/store")
    store.commit_offset("g", "T", 0, 1)
    store.persist()
    store.commit_offset("g", "T", 0, 2)
    store.persist()
    fs.write_atomic(PATH, damage)
    again = ConsumerOffsetStore(fs, "/store")
    assert again.load()
    assert again.query_offset("g", "T", 0) == 1


def test_missing_main_file_falls_back_to_bak_and_a_stray_tmp_is_ignored() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH + ".bak", b'{"offsetTable":{"T@g":{0:7}}}')
    fs.write_atomic(PATH + ".tmp", b'{"offsetTable":{"T@g":{0:999}}}')  # a crash mid-persist
    store = ConsumerOffsetStore(fs, "/store")
    assert store.load()
    assert store.query_offset("g", "T", 0) == 7


@pytest.mark.parametrize(
    "bad_main",
    [b"garbage", b"[" * 100_000 + b"]" * 100_000, b'{"offsetTable":' * 50_000 + b"{}" + b"}" * 50_000, b"\xff\xfe"],
    ids=["garbage", "deep_list", "deep_object", "not_utf8"],
)
def test_both_files_bad_fall_back_to_an_empty_table_with_an_error_naming_the_file(
    bad_main: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 19 item 6: never ConfigFileError or RecursionError out of load (and so out of
    open()); the unreadable file is kept as `.damaged` when the table is next persisted."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH, bad_main)
    fs.write_atomic(PATH + ".bak", b'{"offsetTable":{"T@g":[0]}}')  # (a bad entry alone is left out)
    store = ConsumerOffsetStore(fs, "/store")
    with caplog.at_level(logging.ERROR, logger="mqstore"):
        assert not store.load()
    assert store.table() == {}
    logged = [r for r in caplog.records if r.getMessage() == "consumer_offsets_unreadable"]
    assert logged and PATH in logged[0].mqstore_event["path"]  # type: ignore[attr-defined]
    assert "consumerOffset.json.bak" in logged[0].mqstore_event["error"]  # type: ignore[attr-defined]
    store.commit_offset("g", "T", 0, 4)
    store.persist()
    assert fs.read_bytes(PATH + ".damaged") == bad_main  # set aside, never lost
    again = ConsumerOffsetStore(fs, "/store")
    assert again.load() and again.query_offset("g", "T", 0) == 4


def test_each_unreadable_version_is_set_aside_and_none_over_another() -> None:
    """A second damaged consumerOffset.json, later: it went unkept (only the first `.damaged`
    was written, so the next persist replaced the second without a copy). Each distinct
    unreadable version is now kept, as `.damaged`, `.damaged.1`, ..."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    store = ConsumerOffsetStore(fs, "/store")
    for n, damage in enumerate((b"garbage one", b"garbage two", b"garbage two")):
        fs.write_atomic(PATH, damage)
        store.commit_offset("g", "T", 0, n)
        store.persist()
    assert fs.read_bytes(PATH + ".damaged") == b"garbage one"
    assert fs.read_bytes(PATH + ".damaged.1") == b"garbage two"
    assert not fs.exists(PATH + ".damaged.2")  # the same bytes again: kept once


def test_a_bad_main_file_falls_back_to_its_bak() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH, b"[" * 100_000)
    fs.write_atomic(PATH + ".bak", b'{"offsetTable":{"T@g":{0:9}}}')
    store = ConsumerOffsetStore(fs, "/store")
    assert store.load() and store.query_offset("g", "T", 0) == 9


@pytest.mark.parametrize("bak", ["cut short", "an entry of the wrong type"])
def test_an_unreadable_bak_is_served_what_it_holds_and_never_rotated_out(bak: str) -> None:
    """Review 54 H1: main file zero-filled, `.bak` not whole either: only the main file was
    salvaged, so every group read -1; then the second persist copied the new, small main file
    over `.bak` and no file held the groups' offsets any more."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    good = '{"offsetTable":{"T@gA":{0:100,1:101},"T@gB":{0:200}}}'
    backup = good[:-3] if bak == "cut short" else good.replace("{0:200}", '{0:200,1:"x"}')
    fs.write_atomic(PATH + ".bak", backup.encode())
    fs.write_atomic(PATH, bytes(64))
    store = ConsumerOffsetStore(fs, "/store")
    assert store.load()  # partly: what reads is served
    assert (store.query_offset("gA", "T", 0), store.query_offset("gA", "T", 1)) == (100, 101)
    # A number that runs to the end of a file cut short may itself be cut: not served.
    assert store.query_offset("gB", "T", 0) == (-1 if bak == "cut short" else 200)
    for offset in (5, 6):
        store.commit_offset("gX", "T", 0, offset)
        store.persist()
    assert fs.read_bytes(PATH + ".bak.damaged") == backup.encode()  # its bytes kept, for a person
    reloaded = ConsumerOffsetStore(fs, "/store")
    assert reloaded.load() and reloaded.query_offset("gA", "T", 1) == 101 and reloaded.query_offset("gX", "T", 0) == 6


def test_a_corrupt_main_file_is_not_copied_over_a_good_bak() -> None:
    fs = SimulatedFileSystem()
    store = ConsumerOffsetStore(fs, "/store")
    store.commit_offset("g", "T", 0, 1)
    store.persist()
    store.persist()  # .bak := the good file
    fs.write_atomic(PATH, b"garbage")
    store.commit_offset("g", "T", 0, 3)
    store.persist()
    assert json.loads(fs.read_bytes(PATH + ".bak"))["offsetTable"]["T@g"] == {"0": 1}


def test_persist_survives_a_crash_with_old_or_new_content() -> None:
    fs = SimulatedFileSystem()
    store = ConsumerOffsetStore(fs, "/store")
    store.commit_offset("g", "T", 0, 1)
    store.persist()
    store.commit_offset("g", "T", 0, 2)
    fs.inject_fault("write", path_contains="consumerOffset.json")  # the .bak write fails
    with pytest.raises(OSError):
        store.persist()
    after = ConsumerOffsetStore(fs.crash(seed=4), "/store")
    assert after.load() and after.query_offset("g", "T", 0) == 1


def test_real_file_system_round_trip_and_fastjson_file_from_rocketmq(tmp_path: Path) -> None:
    root = copy_fixture_root(tmp_path)
    fs = RealFileSystem()
    store = ConsumerOffsetStore(fs, str(root))
    store.load()
    store.commit_offset(GROUP, "TopicTest", 0, 300)
    store.persist()
    assert not (root / "config" / "consumerOffset.json.tmp").exists()
    bak = (root / "config" / "consumerOffset.json.bak").read_text()
    assert "{0:250" in bak  # the original fastjson text, copied verbatim
    again = ConsumerOffsetStore(fs, str(root))
    again.load()
    assert again.query_all(GROUP, "TopicTest") == {0: 300, 1: 250, 2: 250, 3: 250}


def test_something_else_under_a_damaged_copys_name_neither_fails_the_persist_nor_is_read(tmp_path: Path) -> None:
    """A directory at `.damaged.1` (or a FIFO at its `.tmp`): the persist that set a second
    unreadable version aside failed (IsADirectoryError; the review's reproduction), and the
    commit was lost at close. The copy goes to the next free name, or is not kept (logged);
    the offsets are written either way."""
    import os

    fs = RealFileSystem()
    path = tmp_path / "config" / "consumerOffset.json"
    path.parent.mkdir()
    (tmp_path / "config" / "consumerOffset.json.damaged").write_bytes(b"garbage one")
    (tmp_path / "config" / "consumerOffset.json.damaged.1").mkdir()
    os.mkfifo(tmp_path / "config" / "consumerOffset.json.damaged.2.tmp")
    path.write_bytes(b"garbage two")
    store = ConsumerOffsetStore(fs, str(tmp_path))
    store.commit_offset("g", "T", 0, 9)
    store.persist()
    assert json.loads(path.read_bytes())["offsetTable"] == {"T@g": {"0": 9}}


def test_a_file_cut_short_gives_back_groups_whose_names_need_json_escapes() -> None:
    """Review 108 F4: the salvage of a file cut short matched names without `"`, `{` or `}`
    and kept escapes undecoded: such groups were served -1, and two written back under wrong
    keys (a literal backslash-n, a doubled backslash)."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    store = ConsumerOffsetStore(fs, "/store")
    groups = ["plain", "g\n2", "g\\x", 'g"q', "g{1}", "g é"]
    for n, group in enumerate(groups):
        store.commit_offset(group, "orders", 0, 100 + n)
    store.commit_offset("zzz", "orders", 0, 7)  # (written last: the keys are sorted)
    store.persist()
    whole = fs.read_bytes(PATH)
    fs.write_atomic(PATH, whole[: whole.rindex(b'"orders@zzz"') + 20])  # cut inside the last entry
    again = ConsumerOffsetStore(fs, "/store")
    assert again.load()
    assert [again.query_offset(group, "orders", 0) for group in groups] == [100 + n for n in range(len(groups))]
    again.persist()
    reloaded = ConsumerOffsetStore(fs, "/store")
    assert reloaded.load() and [reloaded.query_offset(g, "orders", 0) for g in groups] == [100 + n for n in range(len(groups))]


@pytest.mark.parametrize(("value", "served"), [("200.0", 200), ("2e2", 200), ("200.5", -1)])
def test_an_offset_written_as_a_whole_float_is_read_as_fastjson_reads_it(value: str, served: int) -> None:
    """Review 108 F5: fastjson reads 200.0 as offset 200 (castToLong); it was left out."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH, ('{"offsetTable":{"T@g":{0:%s,1:5}}}' % value).encode())
    store = ConsumerOffsetStore(fs, "/store")
    assert store.load()
    assert (store.query_offset("g", "T", 0), store.query_offset("g", "T", 1)) == (served, 5)


@pytest.mark.parametrize("queue_id", ["2147483648", "4294967296", "-2147483649"])
def test_a_queue_id_outside_a_java_int_is_left_out_not_written_back(queue_id: str) -> None:
    """Review 108 F5: a queue id a broker's Integer cannot hold was served and written back."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH, ('{"offsetTable":{"T@g":{"%s":200,"1":5}}}' % queue_id).encode())
    store = ConsumerOffsetStore(fs, "/store")
    assert store.load() and store.query_offset("g", "T", 1) == 5
    store.commit_offset("g", "T", 2, 6)
    store.persist()
    assert json.loads(fs.read_bytes(PATH))["offsetTable"]["T@g"] == {"1": 5, "2": 6}


def test_a_5x_file_cut_short_gives_back_only_its_offset_tables_groups() -> None:
    """Review 111 F2: the salvage took every `"topic@group":{...}` of the text, so a RocketMQ
    5.x file's pullOffsetTable (how far a consumer pulled, not what it acknowledged) and
    resetOffsetTable (pending admin resets) replaced the committed offsets: g1 served 30 for 2."""
    doc = ('{"dataVersion":{"counter":3,"timestamp":1},"offsetTable":{"TopicA@g1":{0:2,1:40},"TopicA@g2":{0:50}},'
           '"pullOffsetTable":{"TopicA@g1":{0:30,1:45}},"resetOffsetTable":{"TopicA@g2":{0:1}}}')  # fmt: skip
    for cut in (3, len(doc) - doc.index('"resetOffsetTable"')):
        fs = SimulatedFileSystem()
        fs.makedirs("/store/config")
        fs.write_atomic(PATH, doc[:-cut].encode())
        store = ConsumerOffsetStore(fs, "/store")
        assert store.load() and store.loaded == "partly"
        assert [store.query_offset("g1", "TopicA", q) for q in (0, 1)] + [store.query_offset("g2", "TopicA", 0)] == [2, 40, 50]


def test_a_torn_page_in_the_middle_gives_no_group_another_groups_offsets() -> None:
    """Review 125 F1: with gA's last pair, its `}` and gB's name zeroed (a torn page, no .bak),
    the salvage took every pair up to the next `}` as gA's: gA served gB's 9000 on a queue it
    never committed, its queue 0 went back to gB's 5, and both were written back as gA's."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    store = ConsumerOffsetStore(fs, "/store")
    for group, queue_id, offset in (("gA", 0, 100), ("gA", 1, 200), ("gB", 0, 5), ("gB", 7, 9000)):
        store.commit_offset(group, "T", queue_id, offset)
    store.persist()
    whole = bytearray(fs.read_bytes(PATH))
    start, stop = whole.index(b'"1":200'), whole.index(b'"T@gB":{') + len(b'"T@gB":{')
    whole[start:stop] = bytes(stop - start)
    fs.write_atomic(PATH, bytes(whole))
    again = ConsumerOffsetStore(fs, "/store")
    assert again.load() and again.loaded == "partly"
    served = {(g, q): again.query_offset(g, "T", q) for g in ("gA", "gB") for q in (0, 1, 7)}
    assert served == {("gA", 0): 100, ("gA", 1): -1, ("gA", 7): -1, ("gB", 0): -1, ("gB", 1): -1, ("gB", 7): -1}


def test_control_bytes_in_a_damaged_file_are_no_separator_of_its_pairs() -> None:
    """Review 127 F6: the salvage took Python's whitespace (0x1c-0x1f among it) for JSON's, so
    damage turning `:5,"1"` into 0x1c bytes made queue 0 read queue 1's 9000 (committed: 5)."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH, b'{"offsetTable":{"T@g1":{0' + b"\x1c" * 6 + b':9000},"T@g2":{0:7}}}')
    store = ConsumerOffsetStore(fs, "/store")
    store.load()
    assert store.query_offset("g1", "T", 0) == -1


def test_the_salvage_of_a_name_of_quotes_cut_short_takes_linear_time() -> None:
    """Review 111 F4: the salvage's regex backtracked through a long group name of escaped
    quotes cut short (17.5 s for 80,000 of them)."""
    import time

    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    store = ConsumerOffsetStore(fs, "/store")
    store.commit_offset("!g1", "T", 0, 77)
    store.commit_offset('"' * 80_000, "T", 0, 5)
    store.persist()
    whole = fs.read_bytes(PATH)
    fs.write_atomic(PATH, whole[: len(whole) // 2])
    started = time.monotonic()
    again = ConsumerOffsetStore(fs, "/store")
    assert again.load() and again.query_offset("!g1", "T", 0) == 77
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("queue_id", ['"2147483648"', '"99999999999999999999"', "99999999999999999999"])
def test_one_queue_id_outside_a_java_int_leaves_out_that_entry_only(queue_id: str) -> None:
    """Review 111 F3: one such id refused the whole file, and every group was served its older
    `.bak` (500 back to 400); review 112 O1: one of 20 digits still did."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH, b'{"offsetTable":{"T@g1":{"0":500,"1":600},"T@g2":{"0":700,%s:5}}}' % queue_id.encode())
    fs.write_atomic(PATH + ".bak", b'{"offsetTable":{"T@g1":{"0":400,"1":550},"T@g2":{"0":650}}}')
    store = ConsumerOffsetStore(fs, "/store")
    assert store.load() and store.loaded == "partly"  # (one entry left out)
    assert [store.query_offset("g1", "T", 0), store.query_offset("g1", "T", 1), store.query_offset("g2", "T", 0)] == [500, 600, 700]


def test_a_whole_number_past_a_floats_precision_is_read_exactly() -> None:
    """Review 111 F5: 9007199254740993.0 was read through a float: ...992."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH, b'{"offsetTable":{"T@g":{0:9007199254740993.0}}}')
    store = ConsumerOffsetStore(fs, "/store")
    assert store.load() and store.query_offset("g", "T", 0) == 9007199254740993


@pytest.mark.parametrize("value", ["9223372036854775808", "1.5", "null", '"12x"', "true", "[]", "{}"])
def test_one_bad_offset_value_leaves_out_that_entry_only(value: str) -> None:
    """Review 114 F4: one offset that is no Java long refused the whole file, and every group
    was served its older `.bak` (100 back to 50), written back at the next persist."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH, b'{"offsetTable":{"T@g1":{"0":100},"T@g2":{"0":7,"1":%s}}}' % value.encode())
    fs.write_atomic(PATH + ".bak", b'{"offsetTable":{"T@g1":{"0":50},"T@g2":{"0":3}}}')
    store = ConsumerOffsetStore(fs, "/store")
    assert store.load() and store.loaded == "partly"
    assert [store.query_offset("g1", "T", 0), store.query_offset("g2", "T", 0), store.query_offset("g2", "T", 1)] == [100, 7, -1]
    original = fs.read_bytes(PATH)
    for offset in (101, 102):
        store.commit_offset("g1", "T", 0, offset)
        store.persist()
    assert fs.read_bytes(PATH + ".damaged") == original  # its bytes kept for a person, not rotated away
    again = ConsumerOffsetStore(fs, "/store")
    assert again.load() and again.loaded == "file" and again.query_offset("g1", "T", 0) == 102


@pytest.mark.parametrize("queue_id", ["1_0", "\\uff15", " 4", "4 ", "0x1", ""])
def test_a_queue_id_spelled_other_than_digits_is_left_out(queue_id: str) -> None:
    """Review 114 F5: Python's int() read "1_0" as 10, a full-width 5 as 5, " 4" as 4, and they
    were written back as other keys ({"1_0":77,"10":5} one entry)."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH, ('{"offsetTable":{"T@g":{"%s":77,"10":5,"5":6,"4":8,"+3":9}}}' % queue_id).encode())
    store = ConsumerOffsetStore(fs, "/store")
    assert store.load() and store.loaded == "partly"
    assert store.query_all("g", "T") == {10: 5, 5: 6, 4: 8, 3: 9}  # ("+3": Integer.parseInt reads it)


def test_a_name_with_a_lone_surrogate_is_written_back_escaped() -> None:
    """Review 114 F2: a group or topic name with a lone surrogate escape (valid JSON) loaded,
    and every later persist failed encoding it as UTF-8: every commit after the open was lost."""
    fs = SimulatedFileSystem()
    fs.makedirs("/store/config")
    fs.write_atomic(PATH, b'{"offsetTable":{"T@g1":{"0":10},"T@odd\\ud800":{"0":7}},"x\\udc00":{"a":1}}')
    store = ConsumerOffsetStore(fs, "/store")
    assert store.load() and store.loaded == "file"
    store.commit_offset("g1", "T", 0, 500)
    store.persist()
    again = ConsumerOffsetStore(fs, "/store")
    assert again.load() and again.loaded == "file"
    assert again.query_offset("g1", "T", 0) == 500 and again.query_offset("odd\ud800", "T", 0) == 7
    assert b'"x\\udc00":{"a":1}' in fs.read_bytes(PATH)
