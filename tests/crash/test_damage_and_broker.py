"""Damaged files recover to the last valid record and say so; a RocketMQ broker's directory opens."""

from __future__ import annotations

import os
import shutil

import pytest

import mqstore
from mqstore.cli import main as cli_main
from mqstore.tools.verify import verify_store

SAMPLE = "/work/shared/fixtures/broker-sample-a/commitlog"
SEG = 64 * 1024


def _fill(store_dir: str, n: int = 200) -> None:
    with mqstore.open(store_dir, mapped_file_size_commitlog_bytes=SEG) as store:
        for i in range(n):
            store.put(mqstore.Message(topic="d", queue_id=i % 2, body=b"%05d" % i * 20, keys=[f"k{i}"]))


def test_flipped_body_byte_is_quarantined_and_reported(tmp_path: object) -> None:
    """Damage with valid records after it is not a torn tail: it stays, reported, nothing cut."""
    store_dir = os.path.join(str(tmp_path), "s")
    _fill(store_dir)
    seg = os.path.join(store_dir, "commitlog", "0" * 20)
    with open(seg, "r+b") as f:
        f.seek(20000)
        byte = f.read(1)
        f.seek(20000)
        f.write(bytes([byte[0] ^ 0xFF]))
    open(os.path.join(store_dir, "abort"), "w").close()
    with mqstore.open(store_dir, mapped_file_size_commitlog_bytes=SEG) as store:
        rec = store.supervisor.recovery
        assert rec is not None and len(rec.quarantined) == 1, rec.summary()
        damaged = rec.quarantined[0]
        assert damaged.start <= 20000 < damaged.end and "crc" in damaged.reason.lower(), rec.summary()
        assert rec.damaged_at == -1 and rec.truncated_commitlog_bytes == 0, rec.summary()
    report = verify_store(store_dir)
    assert [p.kind for p in report.problems] == ["commitlog_damaged"], [str(p) for p in report.problems]


@pytest.mark.parametrize("aborted", [False, True])
def test_a_broker_commitlog_opens_and_keeps_growing(tmp_path: object, aborted: bool, capsys: pytest.CaptureFixture[str]) -> None:
    store_dir = os.path.join(str(tmp_path), "b")
    shutil.copytree(SAMPLE, os.path.join(store_dir, "commitlog"))
    for p in os.listdir(os.path.join(store_dir, "commitlog")):
        os.chmod(os.path.join(store_dir, "commitlog", p), 0o644)
    if aborted:
        open(os.path.join(store_dir, "abort"), "w").close()
    with mqstore.open(store_dir, mapped_file_size_commitlog_bytes=8192) as store:
        deadline = 200
        while store.max_offset("abc", 0) < 47 and deadline:
            store.wait_for_messages("abc", 0, 46, 0.05)
            deadline -= 1
        from crashlib import read_all

        messages = read_all(store, "abc", 0)
        assert [m.queue_offset for m in messages] == list(range(47))
        got = store.get("abc", 0, 0, 1)
        key = got.messages[0].key_list[0] if got.messages[0].key_list else got.messages[0].uniq_key
        assert key and any(m.commitlog_offset == got.messages[0].commitlog_offset
                           for m in store.query("abc", key).messages)  # fmt: skip
        result = store.put(mqstore.Message(topic="abc", queue_id=0, body=b"new", keys=["after-broker"]))
        assert result.queue_offset == 47 and result.commitlog_offset >= 8192, result
    assert sorted(os.listdir(os.path.join(store_dir, "commitlog")))[1] == "%020d" % 8192
    capsys.readouterr()
    assert cli_main(["dump", store_dir]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 48
    assert verify_store(store_dir, config=mqstore.StoreConfig(mapped_file_size_commitlog_bytes=8192)).ok
