"""`mqstore clean STORE_DIR [--now]`: RocketMQ's manual deletion from the command line."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import mqstore
from mqstore.cli import ExitCode, main

SEGMENT = 64 * 1024
BODY = b"c" * 900  # about 70 records per segment
DAY_S = 24 * 3600


@pytest.fixture(autouse=True)
def small_store_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The same settings for the test's own opens and the command's (MQSTORE_* variables): small
    files, no pauses, and a deletion hour that is not now, so only --now or a full disk delete."""
    not_now = f"{(time.localtime().tm_hour + 12) % 24:02d}"
    for key, value in {"MAPPED_FILE_SIZE_COMMITLOG_BYTES": SEGMENT, "MAPPED_FILE_SIZE_CONSUME_QUEUE_BYTES": 2000,
                       "MAX_HASH_SLOT_NUM": 100, "MAX_INDEX_NUM": 400, "DELETE_COMMITLOG_FILES_INTERVAL_MS": 0,
                       "DELETE_CONSUME_QUEUE_FILES_INTERVAL_MS": 0, "DELETE_WHEN": not_now,
                       "DISK_MAX_USED_SPACE_RATIO_PERCENT": 95}.items():  # fmt: skip
        monkeypatch.setenv(f"MQSTORE_{key}", str(value))
    root = logging.getLogger("mqstore")  # main() configures logging: undo it afterwards
    saved = (list(root.handlers), root.level, root.propagate)
    yield
    root.handlers[:], root.propagate = saved[0], saved[2]
    root.setLevel(saved[1])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def segments(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root / "commitlog") if n.isdigit())


def old_store(root: Path, full_segments: int, aged: int) -> int:
    """A closed store with `full_segments` complete segments, the first `aged` of them 4 days
    old by their file times; returns the queue offset of the first message in a young segment."""
    with mqstore.open(root) as store:
        first_young = -1
        while True:
            r = store.put(mqstore.Message(topic="C", body=BODY, keys=["k"]))
            assert r.ok
            if first_young < 0 and r.commitlog_offset >= aged * SEGMENT:
                first_young = r.queue_offset
            if r.commitlog_offset >= full_segments * SEGMENT:
                break
    old = time.time() - 4 * DAY_S
    for name in segments(root)[:aged]:
        os.utime(root / "commitlog" / name, (old, old))
    return first_young


def test_now_deletes_the_expired_segments_and_the_queue_files_below_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "s"
    first_young = old_store(root, full_segments=4, aged=3)
    before = segments(root)
    code, out, err = run(capsys, "clean", str(root), "--now", "--json")
    assert code == ExitCode.OK, err
    report = json.loads(out)
    assert report["mode"] == "now" and report["ran"] and report["clean_stop"]
    assert not report["timeup"] and not report["clean_immediately"]
    assert report["deleted"]["commitlog"] == [f"commitlog/{n}" for n in before[:3]]
    assert report["commitlog_deleted"] == 3
    assert report["deleted"]["consumequeue"] == ["consumequeue/C/0/00000000000000000000"]  # units 0..99
    assert segments(root) == before[3:]
    with mqstore.open(root) as store:  # the young messages are all there
        assert store.min_offset("C", 0) > 0
        got = store.get("C", 0, first_young, 1)
        assert got.found and got.messages[0].commitlog_offset >= 3 * SEGMENT
    code, out, _ = run(capsys, "clean", str(root), "--now")
    assert code == ExitCode.OK and "nothing deleted: no commitlog segment is older than 72 h" in out


def test_the_rules_still_apply_the_newest_segment_and_young_ones_stay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    old_store(root, full_segments=2, aged=0)
    before = segments(root)
    code, out, _ = run(capsys, "clean", str(root), "--now")
    assert code == ExitCode.OK and "nothing deleted" in out
    assert segments(root) == before


def test_without_now_it_keeps_the_schedule_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    old_store(root, full_segments=3, aged=2)
    before = segments(root)
    code, out, _ = run(capsys, "clean", str(root))
    assert code == ExitCode.OK
    assert "not a deletion hour" in out and "--now" in out
    assert segments(root) == before
    code, out, _ = run(capsys, "clean", str(root), "--json")
    report = json.loads(out)
    assert report["mode"] == "scheduled" and not report["ran"] and report["deleted"]["commitlog"] == []


def test_a_running_store_is_refused_with_exit_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    with mqstore.open(root):
        code, _, err = run(capsys, "clean", str(root), "--now")
    assert code == ExitCode.LOCKED
    assert "the store is running" in err and "stop it first" in err


def test_not_a_store_and_a_segment_size_other_than_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "clean", str(tmp_path / "missing"), "--now")
    assert code == ExitCode.NOT_A_STORE
    root = tmp_path / "s"
    old_store(root, full_segments=1, aged=0)
    monkeypatch.setenv("MQSTORE_MAPPED_FILE_SIZE_COMMITLOG_BYTES", str(2 * SEGMENT))
    code, _, err = run(capsys, "clean", str(root), "--now")
    # Issue 14: the files decide; an explicit setting against them is refused, naming both values.
    assert code == ExitCode.USAGE and "mapped_file_size_commitlog_bytes=131072" in err and "=65536" in err


def test_an_interrupted_clean_stops_its_rounds_and_reports_what_it_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 94 L1: Ctrl-C went on deleting for its round, then exited 130 with nothing
    said; the operator had no list of what was gone."""
    from mqstore.store import MessageStore

    root = tmp_path / "s"
    old_store(root, full_segments=4, aged=3)
    before = segments(root)
    rounds: list[int] = []
    delete_now = MessageStore.delete_expired_files_now

    def interrupted_after_the_first_round(self: MessageStore) -> int:
        rounds.append(1)
        if len(rounds) > 1:
            raise KeyboardInterrupt
        return delete_now(self)

    monkeypatch.setattr(MessageStore, "delete_expired_files_now", interrupted_after_the_first_round)
    code, out, err = run(capsys, "clean", str(root), "--now", "--json")
    assert code == 130 and "interrupted" in err, err
    report = json.loads(out)
    assert report["interrupted"] and report["clean_stop"] and len(rounds) == 2
    gone = sorted(set(before) - set(segments(root)))
    assert gone and report["deleted"]["commitlog"] == [f"commitlog/{n}" for n in gone]
