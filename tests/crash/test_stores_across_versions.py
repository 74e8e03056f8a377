"""A store carried across mqstore versions (review 62). A writer that keeps no queue ledger (an
older mqstore, or a RocketMQ broker) may have run on the store: its retention deleted the first
files, and its puts moved past the ledger's count without a word. And a newer mqstore's own
files may meet this code after a rollback: it refuses them, rather than taking them for damage
and opening without the guarantees they carry."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

import mqstore
from mqstore import Message
from mqstore.cli import ExitCode, main
from mqstore.storage.lockfiles import StoreDirectoryError
from mqstore.storage.sealed import seal
from mqstore.tools.verify import verify_store

SETTINGS: dict[str, Any] = dict(
    mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=20 * 50,
    max_hash_slot_num=64, max_index_num=256, clean_resource_interval_ms=300,
)  # fmt: skip
N, LATER = 1500, 50


def _read_all(store: mqstore.MessageStore, topic: str) -> list[bytes]:
    bodies: list[bytes] = []
    offset = store.min_offset(topic, 0)
    while True:
        got = store.get(topic, 0, offset, 32)
        bodies += [m.body for m in got.messages]
        if got.next_begin_offset == offset:
            return bodies
        offset = got.next_begin_offset


def test_a_queue_rebuilt_after_a_ledger_unaware_writers_retention_continues_after_its_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review 62 H1: a writer that keeps no ledger deleted the first segments and queue files
    (its retention) and put more, leaving the ledger as it was. The open rebuilds the queue; the
    writer's scan for the queue offsets the log holds started at offset 0, in a deleted segment,
    found nothing, and the next put was given the ledger's stale count: an offset a record in
    the log holds, so the acknowledged put never got a unit."""
    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        for i in range(N):
            assert store.put(Message(topic="T", body=b"m%05d-" % i + b"x" * 150, keys=[f"k{i}"])).ok
    # What the ledger-unaware writer leaves: its own files as this code wrote them last.
    kept = {name: (root / name).read_bytes() for name in ("queue_ledger.msgpack", "index_progress.msgpack")}
    queue_dir = root / "consumequeue" / "T" / "0"
    with mqstore.open(root, file_reserved_time_hours=0, **SETTINGS) as store:
        assert store.delete_expired_files_now() > 0
        deadline = time.monotonic() + 10
        while "00000000000000000000" in os.listdir(queue_dir) and time.monotonic() < deadline:
            time.sleep(0.05)  # the queue's first files go at a later round
        assert "00000000000000000000" not in os.listdir(queue_dir)
        for i in range(LATER):
            assert store.put(Message(topic="T", body=b"old%d" % i)).queue_offset == N + i
    for name, data in kept.items():
        (root / name).write_bytes(data)

    caplog.clear()
    with mqstore.open(root, **SETTINGS) as store:
        assert store.max_offset("T", 0) == N + LATER
        put = store.put(Message(topic="T", body=b"new"))
        assert put.ok and put.queue_offset == N + LATER, put
        assert store.wait_for_messages("T", 0, N + LATER, timeout_s=10)
    # L1: the operator is not sent looking only for a person who deleted files.
    assert any("first files were deleted" in r.getMessage() and "an older mqstore or a RocketMQ broker" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]  # fmt: skip
    with mqstore.open(root, **SETTINGS) as store:
        bodies = _read_all(store, "T")
        assert bodies[-LATER - 1:] == [b"old%d" % i for i in range(LATER)] + [b"new"]
    assert verify_store(str(root), config=mqstore.StoreConfig(**SETTINGS)).ok


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _as_a_newer_mqstore_writes_it(path: Path, field: str, version: int) -> None:
    """The same content, sealed as the next format version (checksum valid)."""
    document = msgpack.unpackb(path.read_bytes(), raw=False)
    path.write_bytes(seal(document["format"], version, field, msgpack.unpackb(document[field], raw=False)))


@pytest.mark.parametrize("newer", ["queue_ledger", "index_progress"])
def test_a_newer_mqstores_ledger_or_index_progress_is_refused_and_nothing_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], newer: str
) -> None:
    """Review 62 H2: a newer version of mqstore's own file was taken for damage: set aside as
    .damaged, and the open went on without the guarantees it carries (the queue offsets the
    ledger reserves were handed out again). The open, `mqstore recover` and the read-only
    commands now refuse it, name it, and change no byte."""
    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        for i in range(30):
            assert store.put(Message(topic="T", body=b"m%d" % i, keys=[f"k{i}"])).ok
    path = root / f"{newer}.msgpack"
    version = {"queue_ledger": 4, "index_progress": 2}[newer]
    _as_a_newer_mqstore_writes_it(path, {"queue_ledger": "queues", "index_progress": "progress"}[newer], version)
    before = _files(root)
    with pytest.raises(StoreDirectoryError, match=f"{path} is .* version {version}, written by a newer mqstore"):
        mqstore.open(root, **SETTINGS)
    assert _files(root) == before
    for command in ("verify", "inspect", "stats", "recover"):
        assert main([command, str(root)]) == ExitCode.NOT_A_STORE, command
        said = capsys.readouterr().err
        assert f"mqstore {command}: {path} is " in said and "newer mqstore" in said, (command, said)
        assert _files(root) == before, command
