"""A store reopened with a smaller max_message_size_bytes than a stored record keeps serving
that record: the setting limits what a put may store, not what reads take (a record is whole
if it fits its segment and its CRC and field lengths agree, as RocketMQ reads it). Before,
recovery quarantined the intact record, get skipped its queue offset with FOUND (a consumer
committed past an acknowledged message), and after a crash its queue unit and index entry
were cut for good."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import Message

_FILL = textwrap.dedent(
    """
    import os, sys, mqstore
    from mqstore import Message
    s = mqstore.open(sys.argv[1])
    for body, key in ((b"small0", "a0"), (b"B" * (1 << 20), "big"), (b"small1", "a1")):
        assert s.put(Message("t", body, keys=[key])).ok
    s.flush()
    if sys.argv[2] == "crash":
        os.kill(os.getpid(), 9)
    s.close()
    """
)


def _read_all(store: mqstore.MessageStore) -> list[Any]:
    out: list[Any] = []
    offset = 0
    while (got := store.get("t", 0, offset, 32)).messages:  # 4.4.0 hands a large record alone
        out.extend(got.messages)
        offset = got.next_begin_offset
    return out


def _served_whole(store: mqstore.MessageStore) -> None:
    assert [(m.queue_offset, len(m.body)) for m in _read_all(store)] == [(0, 6), (1, 1 << 20), (2, 6)]
    assert [len(m.body) for m in store.query("t", "big").messages] == [1 << 20]
    report = store.supervisor.recovery
    assert report is not None and report.quarantined == [] and report.truncated_commitlog_bytes == 0


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_a_stored_record_past_the_new_limit_is_served_and_kept(tmp_path: Path, stop: str) -> None:
    path = tmp_path / "s"
    subprocess.run([sys.executable, "-c", _FILL, str(path), stop], timeout=60, check=False)
    with mqstore.open(path, max_message_size_bytes=65536) as store:
        _served_whole(store)
        assert not store.put(Message("t", b"B" * (1 << 17))).ok  # the limit still holds for puts
    with mqstore.open(path) as store:
        _served_whole(store)


def test_a_record_larger_than_reputs_read_chunk_is_dispatched(tmp_path: Path) -> None:
    """Records put under an 8 MiB limit, re-dispatched (the queues rebuilt) under the default
    4 MiB one: reput reads the log in 4 MiB chunks, and a record that alone fills more than a
    chunk is read whole, not taken for damage and skipped."""
    import shutil

    path = tmp_path / "s"
    bodies = [b"a", b"B" * (5 << 20), b"c", b"D" * (6 << 20)]
    with mqstore.open(path, max_message_size_bytes=8 << 20) as store:
        for i, body in enumerate(bodies):
            assert store.put(Message("t", body, keys=[f"k{i}"])).ok
    shutil.rmtree(path / "consumequeue")
    shutil.rmtree(path / "index")
    with mqstore.open(path) as store:
        assert [len(m.body) for m in _read_all(store)] == [len(b) for b in bodies]
        assert [len(m.body) for m in store.query("t", "k3").messages] == [6 << 20]


def _quarantined_big_record(root: Path) -> None:
    """A crashed store without mqstore's queue ledger (as a broker's), its queues gone: a 1 MiB
    record with a damaged body and a valid record after it, so recovery quarantines it."""
    import shutil

    with mqstore.open(root, mapped_file_size_commitlog_bytes=4 << 20) as store:
        assert store.put(Message("t", b"small0")).queue_offset == 0
        big = store.put(Message("t", b"B" * (1 << 20)))
        assert big.queue_offset == 1
        assert store.put(Message("u", b"after")).ok
    with open(root / "commitlog" / ("%020d" % 0), "r+b") as f:
        f.seek(big.commitlog_offset + 200)  # inside the body: the header stays readable
        f.write(b"X")
    shutil.rmtree(root / "consumequeue")
    (root / "queue_ledger.msgpack").unlink()
    (root / "abort").touch()


@pytest.mark.parametrize("max_message_size", [65536, None])
def test_a_quarantined_record_past_the_put_limit_keeps_its_queue_offset(tmp_path: Path, max_message_size: int | None) -> None:
    """The quarantined record's header names its queue offset, which no later put is given
    again (a consumer may have read it), whatever the put limit now is."""
    root = tmp_path / "s"
    _quarantined_big_record(root)
    limit = {} if max_message_size is None else {"max_message_size_bytes": max_message_size}
    with mqstore.open(root, mapped_file_size_commitlog_bytes=4 << 20, **limit) as store:
        report = store.supervisor.recovery
        assert report is not None and report.quarantined, report.summary()
        assert store.put(Message("t", b"new")).queue_offset == 2
