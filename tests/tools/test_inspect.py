"""`mqstore inspect` and `mqstore stats` on broker samples and on stores we write, healthy and damaged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.cli import ExitCode, main
from mqstore.tools import inspect_cli
from mqstore.tests.crash.crashlib import flushed_only_to


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict | str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if "--json" in argv and out.strip() else out), err


# Small files so a store spans several segments.
SMALL_STORE = {
    "mapped_file_size_commitlog_bytes": 64 * 1024,
    "mapped_file_size_consume_queue_bytes": 20 * 100,
    "max_hash_slot_num": 1000,
    "max_index_num": 4000,
}


def write_store(root: Path, messages: int = 600, *, close: bool = True) -> mqstore.MessageStore:
    store = mqstore.open(root, **SMALL_STORE)
    for i in range(messages):
        body = f"BODY-{i:06d}-".encode() + b"p" * 200
        assert store.put(mqstore.Message(topic=f"T{i % 2}", body=body, queue_id=i % 3, keys=[f"key-{i}"])).ok
    if close:
        assert store.close()
    return store


@pytest.mark.parametrize("sample", ["broker-sample-a", "broker-sample-b"])
def test_inspect_reads_a_real_broker_segment_as_healthy(copy_fixture, capsys: pytest.CaptureFixture[str], sample: str) -> None:  # type: ignore[no-untyped-def]
    root = copy_fixture(sample)
    code, report, err = run(capsys, "inspect", str(root), "--json")
    assert code == ExitCode.OK, err
    assert report["verdict"] == "healthy"
    cl = report["commitlog"]
    assert cl["messages"] == 47 and cl["topics"] == {"abc": {"messages": 47, "bytes": 47 * 172}}
    assert cl["min_offset"] == 0 and cl["max_offset"] == 8084  # the blank record at 8084 ends the data
    assert cl["segments"][0]["end"] == "blank" and cl["segments"][0]["size"] == 8192
    assert report["lock"] == {"lock_file": False, "held": False, "holder_pid": None, "abort_file": False}
    if sample == "broker-sample-b":
        assert report["checkpoint"]["physic_msg_timestamp"] == 1551626238066
        assert report["checkpoint"]["physic_msg_time"] == "2019-03-03T15:17:18.066Z"
    else:
        assert report["checkpoint"] is None
    code, text, _ = run(capsys, "inspect", str(root))
    assert code == 0 and "HEALTHY" in text and "00000000000000000000" in text


def test_stats_of_a_broker_sample_without_queues(copy_fixture, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    root = copy_fixture("broker-sample-b")
    code, report, _ = run(capsys, "stats", str(root), "--json")
    assert code == 0
    assert report["commitlog"] == {"segments": 1, "segment_size": 8192, "min_offset": 0, "max_offset": 8084, "data_bytes": 8084}
    assert report["running"] is False and report["messages"] == 0


def test_inspect_of_our_closed_store_lists_segments_queues_and_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    write_store(root)
    code, r, err = run(capsys, "inspect", str(root), "--json")
    assert code == 0, err
    assert r["verdict"] == "healthy", r["problems"]
    cl = r["commitlog"]
    assert cl["messages"] == 600 and len(cl["segments"]) >= 3
    assert [s["start_offset"] for s in cl["segments"]] == [i * 65536 for i in range(len(cl["segments"]))]
    assert sum(s["messages"] for s in cl["segments"]) == 600
    queues = {(q["topic"], q["queue_id"]): q for q in r["consume_queues"]}
    assert len(queues) == 6 and sum(q["messages"] for q in queues.values()) == 600
    assert all(q["min_offset"] == 0 and q["max_offset"] == 100 for q in queues.values())
    assert all(q["files"] == 1 for q in queues.values())  # 100 units of 20 bytes fill one 2000-byte file
    assert sum(f["entries"] for f in r["index"]) >= 600  # one entry per key, plus the UNIQ_KEYs
    assert r["checkpoint"]["physic_msg_timestamp"] > 0
    assert r["lock"]["lock_file"] and not r["lock"]["held"] and not r["lock"]["abort_file"]
    code, s, _ = run(capsys, "stats", str(root), "--json")
    assert code == 0
    assert s["messages"] == 600 and s["topics"] == {"T0": {"queues": 3, "messages": 300}, "T1": {"queues": 3, "messages": 300}}
    assert s["commitlog"]["max_offset"] == cl["max_offset"]
    assert s["checkpoint"]["physic_msg_timestamp"] == r["checkpoint"]["physic_msg_timestamp"]


def test_a_running_store_is_reported_running_with_the_lock_holder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    store = write_store(root, 50, close=False)
    try:
        code, r, _ = run(capsys, "inspect", str(root), "--json")
        assert code == 0 and r["verdict"] == "running"
        assert r["lock"]["held"] and r["lock"]["abort_file"]
        assert r["lock"]["holder_pid"] == os.getpid()
        code, text, _ = run(capsys, "stats", str(root))
        assert code == 0 and "the store is running" in text
    finally:
        store.close()
    code, r, _ = run(capsys, "inspect", str(root), "--json")
    assert r["verdict"] == "healthy" and not r["lock"]["held"]


@pytest.mark.parametrize("lock_file", ["deleted", "replaced"])
def test_a_running_store_whose_lock_file_is_gone_is_still_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lock_file: str
) -> None:
    """Review 53 L3: after a "stale lock" clean-up (`rm lock`) under a running store, the tools
    said it did not stop cleanly and advised `mqstore recover`. The flock the store holds on
    its commitlog directory still says it runs: the tools say so (get and verify exit 4), and a
    second opener's refusal names the deleted lock file."""
    root = tmp_path / "s"
    store = write_store(root, 50, close=False)
    try:
        (root / "lock").unlink()
        if lock_file == "replaced":
            (root / "lock").write_bytes(b"")
        code, r, err = run(capsys, "inspect", str(root), "--json")
        assert code == 0 and r["verdict"] == "running" and "mqstore recover" not in err, err
        assert r["lock"]["held"] and r["lock"]["holder_pid"] == os.getpid()
        assert r["lock"]["held_through"] == str(root / "commitlog")
        assert not any(p["kind"] == "abort_file" for p in r["problems"])
        code, text, err = run(capsys, "inspect", str(root))
        assert "its lock file was deleted or replaced" in text and "mqstore recover" not in err
        code, text, err = run(capsys, "stats", str(root))
        assert code == 0 and "the store is running" in text and "mqstore recover" not in err
        for argv in (["get", str(root), "--topic", "T0", "--queue", "0", "--offset", "0"], ["verify", str(root)]):
            code, _, err = run(capsys, *argv)
            assert code == ExitCode.LOCKED and "mqstore recover" not in err, (argv, err)
        code, _, err = run(capsys, "dump", str(root))
        assert code == 0 and "mqstore recover" not in err, err
        assert (root / "lock").exists() == (lock_file == "replaced")  # the commands made none
        other = subprocess.run([sys.executable, "-c", f"import mqstore; mqstore.open({str(root)!r})"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert "StoreLockedError" in other.stderr and "its lock file was deleted" in other.stderr, other.stderr
        assert store.put(mqstore.Message(topic="T0", body=b"after")).ok
    finally:
        assert store.close()
    code, r, _ = run(capsys, "inspect", str(root), "--json")
    assert r["verdict"] == "healthy" and not r["lock"]["held"]


def test_a_running_store_that_puts_while_inspect_reads_its_log_has_no_units_past_its_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 53 L2: inspect read the log's end, then the queues and the index, which a running
    store had moved on meanwhile: units and index entries of the records appended since were
    listed past the log's end ("needs recovery"). What they held before the log was read is
    what is checked now; a unit past the end that was there before still is a problem."""
    root = tmp_path / "s"
    store = write_store(root, 50, close=False)
    # A put answers when stored, and dispatch follows: read (this thread's writes) so that every
    # queue holds its units before inspect reads them; else it may list none.
    assert store.get("T1", 49 % 3, 0, 32).messages
    scan = inspect_cli._inspect_commitlog

    def scan_then_put(*args: Any, **kwargs: Any) -> Any:
        found = scan(*args, **kwargs)
        for i in range(20):  # appended and dispatched after the log's end was read
            last = store.put(mqstore.Message(topic="T0", body=b"late", queue_id=0, keys=[f"late-{i}"]))
            assert last.ok
        # The queues and the index have them (each read waits for its own owner: a CI run under
        # load had the index ahead of the queues when only the query waited).
        assert [m.body for m in store.get("T0", 0, last.queue_offset, 1).messages] == [b"late"]
        assert [m.body for m in store.query("T0", "late-19").messages] == [b"late"]
        return found

    monkeypatch.setattr(inspect_cli, "_inspect_commitlog", scan_then_put)
    try:
        code, r, _ = run(capsys, "inspect", str(root), "--json")
        assert code == 0 and r["verdict"] == "running"
        assert r["problems"] == [], r["problems"]
        assert max(q["max_commitlog_offset"] for q in r["consume_queues"]) >= r["commitlog"]["max_offset"]
    finally:
        monkeypatch.setattr(inspect_cli, "_inspect_commitlog", scan)
        assert store.close()


def test_an_abort_file_means_needs_recovery(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    write_store(root, 30)
    (root / "abort").write_bytes(b"")
    code, r, _ = run(capsys, "inspect", str(root), "--json")
    assert code == 0 and r["verdict"] == "needs recovery"
    assert any(p["kind"] == "abort_file" for p in r["problems"])


def test_a_flipped_body_byte_is_named_by_file_and_offset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    write_store(root, 600)
    seg = root / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    pos = data.index(b"BODY-000010-")
    data[pos + 15] ^= 0xFF
    seg.write_bytes(bytes(data))
    code, r, err = run(capsys, "inspect", str(root), "--json")
    assert code == ExitCode.CORRUPT
    assert r["verdict"] == "damaged"
    bad = [p for p in r["problems"] if p["kind"] == "corrupt_record"]
    assert len(bad) == 1 and bad[0]["file"] == str(seg)
    assert bad[0]["file_position"] < pos < bad[0]["file_position"] + 300  # the record holding the byte
    assert "crc" in bad[0]["reason"].lower()
    assert str(seg) in err and f"file position {bad[0]['file_position']}" in err


@pytest.mark.parametrize("crashed", [False, True])
def test_a_record_whose_physical_offset_field_is_wrong_is_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   crashed: bool) -> None:  # fmt: skip
    """Review 99 N2: inspect took a record whose physical-offset field (outside the body CRC)
    names another offset for a valid one: "needs recovery" (or healthy) where get and verify
    say damaged and recovery quarantines it."""
    root = tmp_path / "s"
    write_store(root, 600)
    seg = root / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    at = data.index(b"BODY-000010-") - 88  # (its body follows 88 bytes of fixed fields)
    assert int.from_bytes(data[at + 28 : at + 36], "big") == at
    data[at + 28 : at + 36] = (at - 8).to_bytes(8, "big")
    seg.write_bytes(bytes(data))
    if crashed:
        (root / "abort").write_bytes(b"")
    code, r, _ = run(capsys, "inspect", str(root), "--json")
    assert code == ExitCode.CORRUPT and r["verdict"] == "damaged", r["problems"]
    bad = [p for p in r["problems"] if p["kind"] == "corrupt_record"]
    assert [p["commitlog_offset"] for p in bad] == [at] and f"record says it is at {at - 8}" in bad[0]["reason"]


def test_a_segment_of_the_wrong_size_is_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    write_store(root, 600)
    seg = sorted((root / "commitlog").iterdir())[1]
    with open(seg, "r+b") as f:
        f.truncate(1000)
    code, r, err = run(capsys, "inspect", str(root), "--json")
    assert code == ExitCode.CORRUPT and r["verdict"] == "damaged"
    assert any(p["kind"] == "segment_size" and p["file"] == str(seg) for p in r["problems"])
    assert seg.name in err


def test_a_leftover_store_copy_is_named_with_the_two_ways_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Review 39 F4: inspect said "healthy" (or named `mqstore recover`, which refuses) beside
    # the copy a run saved of a segment another process replaced.
    root = tmp_path / "s"
    write_store(root, 100)
    seg = sorted((root / "commitlog").iterdir())[0]
    copy = Path(f"{seg}.store-copy")
    copy.write_bytes(seg.read_bytes())
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    code, r, err = run(capsys, "inspect", str(root), "--json")
    assert code == ExitCode.CORRUPT and r["verdict"] == "damaged"
    found = [p for p in r["problems"] if p["kind"] == "store_copy"]
    assert found and found[0]["file"] == copy.name and "move the copy over the segment" in found[0]["message"]
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before  # read-only


def test_a_queue_unit_pointing_elsewhere_is_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    write_store(root, 60)
    cq = root / "consumequeue" / "T0" / "0" / "00000000000000000000"
    data = bytearray(cq.read_bytes())
    data[20:40], data[40:60] = data[40:60], data[20:40]  # units 1 and 2 swapped
    cq.write_bytes(bytes(data))
    code, r, _ = run(capsys, "inspect", str(root), "--json")
    assert code == ExitCode.CORRUPT
    bad = [p for p in r["problems"] if p["kind"] == "cq_unit_mismatch"]
    assert bad and bad[0]["topic"] == "T0" and bad[0]["queue_offset"] == 1


def test_filler_units_recovery_wrote_are_not_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 51: after `mqstore recover` accepted a lost tail, inspect called the store damaged
    (cq_unit_mismatch) for the filler units recovery wrote to hold the lost records' queue
    offsets (commitlog offset 0, size 0x7FFFFFFF: they point at nothing), and kept saying so."""
    import struct

    root = tmp_path / "s"
    write_store(root, 60)
    cq = root / "consumequeue" / "T0" / "0" / "00000000000000000000"
    data = bytearray(cq.read_bytes())
    used = next(i for i in range(0, len(data), 20) if data[i : i + 20] == bytes(20))
    for at in range(used, used + 3 * 20, 20):
        struct.pack_into(">qiq", data, at, 0, 0x7FFFFFFF, 0)
    cq.write_bytes(bytes(data))
    code, r, _ = run(capsys, "inspect", str(root), "--json")
    assert code == 0 and r["verdict"] == "healthy", r["problems"]


def test_a_truncated_log_with_queues_ahead_needs_recovery(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    write_store(root, 60)
    seg = root / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    end = data.index(b"BODY-000050-") - 200  # zero the last records, as if never flushed
    data[end:] = bytes(len(data) - end)
    seg.write_bytes(bytes(data))
    starts, at = [], 0  # the records' starts: the flushed offset lies between two records
    while at < end:
        starts.append(at)
        at += int.from_bytes(data[at : at + 4], "big")
    flushed_only_to(root, starts[-1])  # the zeroed records were never flushed
    (root / "abort").write_bytes(b"")
    code, r, _ = run(capsys, "inspect", str(root), "--json")
    assert code == 0 and r["verdict"] == "needs recovery"
    assert any(p["kind"] == "cq_past_log_end" for p in r["problems"])


@pytest.mark.parametrize("aborted", [False, True])
def test_records_ending_below_the_flushed_offset_are_damage_not_a_torn_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aborted: bool
) -> None:
    # The same zeroed records, but flushed: a segment replaced by an older copy of itself. The
    # open no longer cuts the queues back for it (it refuses puts): inspect said "needs
    # recovery (recovery truncates them)", or healthy after a clean stop.
    root = tmp_path / "s"
    write_store(root, 60)
    seg = root / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    end = data.index(b"BODY-000050-") - 200
    data[end:] = bytes(len(data) - end)
    seg.write_bytes(bytes(data))
    if aborted:
        (root / "abort").write_bytes(b"")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    code, r, _ = run(capsys, "inspect", str(root), "--json")
    assert code == ExitCode.CORRUPT and r["verdict"] == "damaged"
    found = [p for p in r["problems"] if p["kind"] == "commitlog_below_flushed"]
    assert found and "mqstore recover" in found[0]["message"], r["problems"]
    assert not any(p["kind"] == "cq_past_log_end" for p in r["problems"])
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before  # read-only


def test_missing_or_empty_directory_exits_5(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("inspect", "stats"):
        code, _, err = run(capsys, command, str(tmp_path / "nope"))
        assert code == ExitCode.NOT_A_STORE and "does not exist" in err
        code, _, err = run(capsys, command, str(tmp_path))
        assert code == ExitCode.NOT_A_STORE and "is not a store" in err


@pytest.mark.parametrize(
    "where, how",
    [("checkpoint", "fifo"), ("checkpoint", "directory"), ("lock", "fifo"), ("queue_ledger.msgpack", "fifo"),
     ("index_progress.msgpack", "directory"), ("config/consumerOffset.json", "fifo")],
)  # fmt: skip
def test_inspect_refuses_what_the_open_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str,
                                               how: str) -> None:  # fmt: skip
    """Review 103 L4: with a FIFO or a directory where the store keeps one of its files, the
    open refuses the store (StoreDirectoryError) and `inspect` called it HEALTHY, exit 0. It
    refuses it as the open does (exit 5), reading and changing nothing."""
    root = tmp_path / "s"
    write_store(root, 20)
    path = root / where
    if path.exists():
        path.unlink()
    path.parent.mkdir(exist_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    with pytest.raises(mqstore.StoreDirectoryError):
        mqstore.open(root, **SMALL_STORE)
    code, _, err = run(capsys, "inspect", str(root))
    assert code == ExitCode.NOT_A_STORE, err
    assert str(path) in err and "where the store keeps" in err, err


def test_filler_units_are_not_counted_as_messages_nor_taken_for_the_queues_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review 110 F5: `inspect`, `stats` and the offline `get` took filler units (a quarantined
    record's queue offset, commitlog offset 0) for messages: a queue whose first record was
    quarantined had min offset 0 (the store answers 1) and `first phy 0`, and inspect counted
    every filler in `messages`."""
    import shutil
    import struct

    from mqstore.storage.codec import segment_file_name

    root = tmp_path / "s"
    at = {}
    with mqstore.open(root, **SMALL_STORE) as store:
        for i in range(10):
            result = store.put(mqstore.Message(topic="T", body=b"%04d" % i + b"t" * 300))
            assert result.ok and result.queue_offset == i
            at[i] = result.commitlog_offset
    segment_size = SMALL_STORE["mapped_file_size_commitlog_bytes"]
    for damaged in (0, 5):  # a flipped body byte: quarantined, a filler holds its queue offset
        with open(root / "commitlog" / segment_file_name(at[damaged] - at[damaged] % segment_size), "r+b") as f:
            f.seek(at[damaged] % segment_size + 150)
            byte = f.read(1)
            f.seek(at[damaged] % segment_size + 150)
            f.write(bytes([byte[0] ^ 0xFF]))
    shutil.rmtree(root / "consumequeue")
    with mqstore.open(root, **SMALL_STORE) as store:
        assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (1, 10)
        at_start = store.get("T", 0, 0, 32)
        assert (at_start.status.name, at_start.next_begin_offset) == ("OFFSET_TOO_SMALL", 1)
    units = (root / "consumequeue" / "T" / "0" / segment_file_name(0)).read_bytes()
    assert struct.unpack_from(">qi", units, 0) == struct.unpack_from(">qi", units, 100) == (0, 0x7FFFFFFF)

    _, report, _ = run(capsys, "inspect", str(root), "--json")
    assert isinstance(report, dict)
    (queue,) = [q for q in report["consume_queues"] if q["topic"] == "T"]
    assert (queue["min_offset"], queue["max_offset"], queue["messages"]) == (1, 10, 8)
    assert queue["min_commitlog_offset"] == at[1] and queue["max_commitlog_offset"] == at[9]

    _, stats, _ = run(capsys, "stats", str(root), "--json")
    assert isinstance(stats, dict)
    (queue,) = [q for q in stats["queues"] if q["topic"] == "T"]
    # (stats reads a queue's edge units only: the filler inside counts in max - min)
    assert (queue["min_offset"], queue["max_offset"], queue["messages"]) == (1, 10, 9)

    _, got, err = run(capsys, "get", str(root), "--topic", "T", "--queue", "0", "--offset", "0")
    summary = json.loads(err.strip().splitlines()[-1])  # as the store answers
    assert (summary["status"], summary["next_begin_offset"], summary["min_offset"], summary["max_offset"]) == (
        "OFFSET_TOO_SMALL", 1, 1, 10)
    _, got, err = run(capsys, "get", str(root), "--topic", "T", "--queue", "0", "--offset", "1")
    assert [json.loads(line)["queue_offset"] for line in str(got).splitlines()] == [1, 2, 3, 4, 6, 7, 8, 9]
