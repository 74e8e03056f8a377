"""Review 63 F2: a file that is not a checkpoint is refused, naming it and what is wrong, and
never rewritten; a checkpoint cut short is padded as before; every real broker's still opens.

Before: a checkpoint longer than 4096 bytes was cut to 4096 at the open, and 56 bytes of JSON
text were padded to 4096 and their bytes taken as timestamps (recovery's start)."""

from __future__ import annotations

import hashlib
import shutil
import struct
import time
from pathlib import Path

import pytest

import mqstore
from mqstore.cli import ExitCode, main
from mqstore.storage.checkpoint import (
    CHECKPOINT_FILE_SIZE,
    CheckpointError,
    StoreCheckpoint,
    check_checkpoint_bytes,
    create_checkpoint_file,
    read_checkpoint,
)
from mqstore.storage.fs import RealFileSystem, SimulatedFileSystem
from mqstore.storage.lockfiles import StoreDirectoryError

FIXTURES = Path("/work/shared/fixtures")
SETTINGS = dict(
    mapped_file_size_commitlog_bytes=64 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=64,
    max_index_num=400,
)
JSON_TEXT = b'{\n  "paths": [\n    "/some/where"\n  ],\n  "messages": 30\n}\n'  # R4's file: not a checkpoint
NOW_MS = int(time.time() * 1000)
YEAR_MS = 365 * 86_400_000


def _store_with_messages(root: Path, n: int = 5) -> None:
    with mqstore.open(str(root), **SETTINGS) as store:
        for i in range(n):
            assert store.put(mqstore.Message(topic="T", body=b"m%d" % i)).ok


def _digest(path: Path) -> tuple[int, str]:
    data = path.read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()


def _checkpoint(*longs: int, size: int = CHECKPOINT_FILE_SIZE) -> bytes:
    head = struct.pack(f">{len(longs)}q", *longs)
    return (head + bytes(max(0, size - len(head))))[:size]


NOT_CHECKPOINTS = {
    "longer by one byte": lambda good: good + b"\x00",
    "longer by 4096 bytes": lambda good: good + b"\x5a" * 4096,
    "JSON text": lambda good: JSON_TEXT,
    "negative physic timestamp": lambda good: _checkpoint(-5, NOW_MS, 0),
    "logics timestamp 2,000 years ahead": lambda good: _checkpoint(NOW_MS, NOW_MS + 2000 * YEAR_MS, 0),
    "index timestamp of text bytes": lambda good: _checkpoint(NOW_MS, NOW_MS, int.from_bytes(b"mqstore!", "big")),
    "confirmPhyOffset -2": lambda good: _checkpoint(NOW_MS, NOW_MS, 0, 0, -2),
    "masterFlushedOffset far negative": lambda good: _checkpoint(NOW_MS, NOW_MS, 0, -(1 << 62), 0),
}


@pytest.mark.parametrize("case", list(NOT_CHECKPOINTS))
def test_the_open_refuses_what_is_not_a_checkpoint_and_changes_no_byte_of_it(case: str, tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store_with_messages(root)
    cp = root / "checkpoint"
    cp.write_bytes(NOT_CHECKPOINTS[case](cp.read_bytes()))
    before = _digest(cp)
    with pytest.raises(StoreDirectoryError, match="checkpoint") as refused:
        mqstore.open(str(root), **SETTINGS)
    assert isinstance(refused.value, CheckpointError)
    assert str(cp) in str(refused.value)
    assert _digest(cp) == before, "the refused open changed the checkpoint"
    # The lower layers refuse it too, before anything is written.
    fs = RealFileSystem()
    with pytest.raises(CheckpointError):
        read_checkpoint(fs, str(cp))
    with pytest.raises(CheckpointError):
        create_checkpoint_file(fs, str(cp))
    with pytest.raises(CheckpointError):
        StoreCheckpoint(fs, str(cp))
    assert _digest(cp) == before


def test_the_refusal_says_what_is_wrong(tmp_path: Path) -> None:
    cp = tmp_path / "checkpoint"
    cp.write_bytes(b"\x5a" * 4196)
    with pytest.raises(CheckpointError, match=r"4196 bytes, longer than the 4096 bytes"):
        read_checkpoint(RealFileSystem(), str(cp))
    cp.write_bytes(JSON_TEXT)
    with pytest.raises(CheckpointError, match=r"57 bytes.*physicMsgTimestamp \d+ is not a timestamp"):
        read_checkpoint(RealFileSystem(), str(cp))
    cp.write_bytes(_checkpoint(NOW_MS, NOW_MS, 0, 0, -7))
    with pytest.raises(CheckpointError, match=r"confirmPhyOffset -7 is not an offset"):
        read_checkpoint(RealFileSystem(), str(cp))


@pytest.mark.parametrize("command", [["inspect"], ["dump", "--what", "checkpoint"], ["recover"]])
def test_the_tools_refuse_it_naming_the_checkpoint(command: list[str], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    root = tmp_path / "store"
    _store_with_messages(root)
    cp = root / "checkpoint"
    cp.write_bytes(cp.read_bytes() + b"\x5a" * 100)
    before = _digest(cp)
    args = [command[0], str(root), *command[1:]]
    assert main(args) == ExitCode.NOT_A_STORE
    assert f"{cp} is 4196 bytes" in capsys.readouterr().err
    assert _digest(cp) == before


@pytest.mark.parametrize("keep", [0, 5, 12, 24, 40, 100, 4095])
def test_a_checkpoint_cut_short_is_still_padded_and_opens(keep: int, tmp_path: Path) -> None:
    """A cut only lowers the big-endian longs (recovery starts earlier): padded, as before."""
    root = tmp_path / "store"
    _store_with_messages(root)
    cp = root / "checkpoint"
    full = cp.read_bytes()
    cp.write_bytes(full[:keep])
    with mqstore.open(str(root), **SETTINGS) as store:
        assert [m.body for m in store.get("T", 0, 0, 8).messages] == [b"m%d" % i for i in range(5)]
        assert store.put(mqstore.Message(topic="T", body=b"after")).ok
    assert cp.stat().st_size == CHECKPOINT_FILE_SIZE


@pytest.mark.parametrize("sample", ["broker-sample-b", "broker-sample-c"])
def test_real_broker_checkpoints_pass_even_with_a_clock_at_1970(sample: str, tmp_path: Path) -> None:
    data = (FIXTURES / sample / "checkpoint").read_bytes()
    for now in (0, NOW_MS, NOW_MS + 30 * YEAR_MS):
        check_checkpoint_bytes(data, len(data), sample, now_ms=now)
    copy = tmp_path / "checkpoint"
    shutil.copyfile(FIXTURES / sample / "checkpoint", copy)
    copy.chmod(0o644)
    assert read_checkpoint(RealFileSystem(), str(copy)).physic_msg_timestamp > 0
    StoreCheckpoint(RealFileSystem(), str(copy)).close()
    assert copy.read_bytes() == data


def test_plausible_values_pass_and_clock_skew_is_allowed_generously() -> None:
    ok = [
        _checkpoint(0, 0, 0),
        _checkpoint(NOW_MS, NOW_MS - YEAR_MS, 1),
        _checkpoint(NOW_MS + 50 * YEAR_MS, NOW_MS + 50 * YEAR_MS, NOW_MS),  # a clock decades ahead
        _checkpoint(NOW_MS, NOW_MS, 0, -1, -1),  # Java's "none" in the 5.x offsets
        _checkpoint(NOW_MS, NOW_MS, 0, 1 << 40, 1 << 40),
        _checkpoint(5_000, 9_000, 1_000),  # the small timestamps of a test clock
    ]
    for data in ok:
        check_checkpoint_bytes(data, len(data), "cp", now_ms=NOW_MS)
    with pytest.raises(CheckpointError, match="more than 1,000 years ahead"):
        bad = _checkpoint(NOW_MS + 1010 * YEAR_MS, 0, 0)
        check_checkpoint_bytes(bad, len(bad), "cp", now_ms=NOW_MS)


def test_a_simulated_file_system_store_refuses_the_same_way() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        assert store.put(mqstore.Message(topic="T", body=b"z")).ok
    fs.write_atomic("/sim/store/checkpoint", JSON_TEXT)
    with pytest.raises(CheckpointError, match="/sim/store/checkpoint is not a store checkpoint"):
        mqstore.open("/sim/store", fs=fs, **SETTINGS)
    assert fs.read_bytes("/sim/store/checkpoint") == JSON_TEXT


def test_verify_reports_a_checkpoint_the_open_refuses(tmp_path: Path) -> None:
    """verify read no checkpoint, so it passed a store the open refuses (exit 0 against 5)."""
    from mqstore.tools.verify import verify_store

    root = tmp_path / "s"
    with mqstore.open(root) as store:
        assert store.put(mqstore.Message(topic="T", body=b"x")).ok
    assert [p.kind for p in verify_store(root).problems] == []
    (root / "checkpoint").write_bytes((root / "checkpoint").read_bytes() + b"\0" * 100)
    assert [p.kind for p in verify_store(root).problems] == ["checkpoint_not_a_checkpoint"]
