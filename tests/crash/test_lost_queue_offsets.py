"""Queue offsets handed out are never handed out again. Records lost at the log's end (a power
loss that wrote the queue's units or the ledger back but not the records, a lost tail that
`mqstore recover` accepted) leave their queue offsets taken: the next put of the queue
continues after them, and filler units fill the gap. Before, the next put took the first lost
offset, and a consumer that had read the lost record (its offset committed past it) skipped
the new one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import mqstore
from mqstore import Message
from mqstore.storage.queue_ledger import load_queue_ledger
from mqstore.storage.fs import RealFileSystem
from mqstore.tools.verify import verify_store

SETTINGS = dict(mapped_file_size_commitlog_bytes=1 << 20, mapped_file_size_consume_queue_bytes=20 * 50)
N, KEPT = 120, 100


def _read_all(store: mqstore.MessageStore, topic: str) -> list[bytes]:
    bodies: list[bytes] = []
    offset = 0
    while True:
        got = store.get(topic, 0, offset, 32)
        bodies += [m.body for m in got.messages]
        if got.next_begin_offset == offset:
            return bodies
        offset = got.next_begin_offset


@pytest.mark.parametrize("aborted", [False, True])
@pytest.mark.parametrize("ledger", [True, False])
def test_records_lost_at_the_logs_end_keep_their_queue_offsets(tmp_path: Path, aborted: bool, ledger: bool) -> None:
    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        offsets = [store.put(Message(topic="T", body=b"t%d" % i)).commitlog_offset for i in range(N)]
        assert store.wait_for_messages("T", 0, N - 1, timeout_s=10)
    # The last records never reached the disk; the queue's units (and the ledger) did.
    segment = root / "commitlog" / ("%020d" % 0)
    with open(segment, "r+b") as f:
        f.seek(offsets[KEPT])
        f.write(b"\0" * (offsets[-1] + 256 - offsets[KEPT]))
    if not ledger:  # then the queue's own units are the only evidence
        (root / "queue_ledger.msgpack").unlink()
    if aborted:
        (root / "abort").touch()
    with mqstore.open(root, **SETTINGS) as store:
        assert store.max_offset("T", 0) == KEPT
        report = store.supervisor.recovery
        assert report is not None and report.reserved_queue_offsets == {"T-0": N}, report.summary()
    with mqstore.open(root, **SETTINGS) as store:  # the next open still knows: the ledger keeps it
        r = store.put(Message(topic="T", body=b"new"))
        assert r.ok and r.queue_offset == N, r
        assert store.wait_for_messages("T", 0, N, timeout_s=10)
        assert _read_all(store, "T") == [b"t%d" % i for i in range(KEPT)] + [b"new"]
        assert store.max_offset("T", 0) == N + 1
    entries = load_queue_ledger(RealFileSystem(), str(root / "queue_ledger.msgpack"))
    assert entries is not None and entries[("T", 0)].next_offset == N + 1
    assert verify_store(str(root), config=mqstore.StoreConfig(**SETTINGS)).ok


@pytest.mark.parametrize("how", ["crash", "queues deleted"])
def test_a_queue_with_nothing_lost_gets_no_filler(tmp_path: Path, how: str) -> None:
    """A crash (page cache intact) or deleted queue files lose nothing: re-dispatch gives every
    offset its unit back, the queue goes on densely, and no offset is reported lost."""
    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        for i in range(N):
            assert store.put(Message(topic="T", body=b"t%d" % i)).ok
    if how == "crash":
        (root / "abort").touch()
    else:
        shutil.rmtree(root / "consumequeue")
    with mqstore.open(root, **SETTINGS) as store:
        r = store.put(Message(topic="T", body=b"new"))
        assert r.ok and r.queue_offset == N, r
        report = store.supervisor.recovery
        assert report is not None and report.last_exit_ok is (how != "crash")
        assert report.reserved_queue_offsets == {}, report.summary()
        assert store.wait_for_messages("T", 0, N, timeout_s=10)
        assert _read_all(store, "T") == [b"t%d" % i for i in range(N)] + [b"new"]
