"""Queue offsets handed out are never handed out again. Records lost at the log's end (a power
loss that wrote the queue's units or the ledger back but not the records, not yet flushed; a lost tail that
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
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.queue_ledger import LedgerEntry, load_queue_ledger, write_queue_ledger
from mqstore.storage.recovery import recover_store
from mqstore.tools.verify import verify_store

from .crashlib import flushed_only_to

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
    flushed_only_to(root, offsets[KEPT])
    if not ledger:  # then the queue's own units are the only evidence
        (root / "queue_ledger.msgpack").unlink()
    if aborted:
        (root / "abort").touch()
    with mqstore.open(root, **SETTINGS) as store:
        assert store.max_offset("T", 0) in (KEPT, N)  # N once filler units hold the lost offsets
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


def _lose_tail(root: Path) -> None:
    """N records of T, the last N - KEPT of them zeroed in the log (never written back)."""
    with mqstore.open(root, **SETTINGS) as store:
        offsets = [store.put(Message(topic="T", body=b"t%d" % i)).commitlog_offset for i in range(N)]
        assert store.wait_for_messages("T", 0, N - 1, timeout_s=10)
    with open(root / "commitlog" / ("%020d" % 0), "r+b") as f:
        f.seek(offsets[KEPT])
        f.write(b"\0" * (offsets[-1] + 256 - offsets[KEPT]))
    flushed_only_to(root, offsets[KEPT])


@pytest.mark.parametrize("ledger", ["none", "stale"])
def test_recover_keeps_the_offsets_for_the_opens_after_it(tmp_path: Path, ledger: str) -> None:
    """`mqstore recover` (recover_store) cuts the units that show the offsets taken: it writes
    their high water into the ledger first, so the next open still has it. Before, only the
    ConsumeQueue actor wrote it, and with no ledger or one written before the last units were
    flushed the next put took offset KEPT (found by review)."""
    root = tmp_path / "s"
    _lose_tail(root)
    path = root / "queue_ledger.msgpack"
    if ledger == "none":
        path.unlink()  # a broker-written store, or a ledger set aside
    else:
        write_queue_ledger(RealFileSystem(), str(path), {("T", 0): LedgerEntry(KEPT - 10, 0)}, cleaned={})
    cfg = mqstore.StoreConfig(store_path_root_dir=str(root), **SETTINGS)
    report = recover_store(cfg, RealFileSystem(), last_exit_ok=True, clock_ms=lambda: 1_800_000_000_000)
    assert report.reserved_queue_offsets == {"T-0": N}
    with mqstore.open(root, **SETTINGS) as store:
        r = store.put(Message(topic="T", body=b"new"))
        assert r.ok and r.queue_offset == N, r


def test_a_queue_directory_that_cannot_be_a_topic_never_spoils_the_ledger(tmp_path: Path) -> None:
    """A queue whose directory name is no topic (an older version made it) is never in the
    ledger, reserved or not: the ledger must read back for every other queue."""
    root = tmp_path / "s"
    _lose_tail(root)
    bad = root / "consumequeue" / "bad.topic" / "0"
    bad.mkdir(parents=True)
    for f in (root / "consumequeue" / "T" / "0").iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (root / "abort").touch()
    with mqstore.open(root, **SETTINGS) as store:
        assert store.put(Message(topic="T", body=b"new")).queue_offset == N
    entries = load_queue_ledger(RealFileSystem(), str(root / "queue_ledger.msgpack"))
    assert entries is not None and set(entries) == {("T", 0)}, entries


def test_a_reserved_queue_whose_directory_is_gone_is_made_again_once(tmp_path: Path) -> None:
    """The ledger knows a queue whose directory is gone and whose records the log no longer
    holds: the first open rebuilds it from the log's start (nothing comes back), then holds
    its offsets with filler units, so the next open neither rebuilds it again nor lets a put
    take those offsets."""
    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        for i in range(N):
            assert store.put(Message(topic="T", body=b"t%d" % i)).ok
    path = str(root / "queue_ledger.msgpack")
    entries = load_queue_ledger(RealFileSystem(), path)
    assert entries is not None
    write_queue_ledger(RealFileSystem(), path, {**entries, ("Gone", 0): LedgerEntry(50, 0)}, cleaned={})
    with mqstore.open(root, **SETTINGS) as store:
        first = store.supervisor.recovery
        assert first is not None and first.reserved_queue_offsets == {"Gone-0": 50}, first.summary()
        assert first.dispatch_from == 0  # rebuilt from the log's start
    with mqstore.open(root, **SETTINGS) as store:
        second = store.supervisor.recovery
        assert second is not None and second.dispatch_from > 0, second.summary()  # not again
        assert second.reserved_queue_offsets == {}
        r = store.put(Message(topic="Gone", body=b"back"))
        assert r.ok and r.queue_offset == 50, r


def test_a_queue_held_by_filler_units_is_not_re_dispatched_at_every_open(tmp_path: Path) -> None:
    """Found by review: after the lost offsets were filled, each clean open took the filler's
    commitlog offset (0) for the queue's newest and re-dispatched the whole log."""
    root = tmp_path / "s"
    _lose_tail(root)
    with mqstore.open(root, **SETTINGS) as store:
        assert store.supervisor.recovery is not None
        assert store.supervisor.recovery.reserved_queue_offsets == {"T-0": N}
    with mqstore.open(root, **SETTINGS) as store:  # closed once: the fillers are in
        assert store.max_offset("T", 0) == N
    for _ in range(2):
        with mqstore.open(root, **SETTINGS) as store:
            report = store.supervisor.recovery
            assert report is not None and report.dispatch_from >= report.max_offset - 256, report.summary()


def test_a_flipped_queue_offset_field_never_fills_a_huge_gap(tmp_path: Path) -> None:
    """Found by review: the body CRC does not cover the queue-offset field; a flipped bit in
    the last record's made the next put's queue offset huge, and a version that trusted every
    put after the open filled the gap (bit 40: terabytes of filler units). Only offsets
    recovery reserved are filled past MAX_FILLED_GAP_UNITS."""
    import struct

    from mqstore.storage import codec

    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        offsets = [store.put(Message(topic="T", body=b"t%d" % i)).commitlog_offset for i in range(10)]
        assert store.wait_for_messages("T", 0, 9, timeout_s=10)
    with open(root / "commitlog" / ("%020d" % 0), "r+b") as f:
        f.seek(offsets[-1] + codec.QUEUE_OFFSET_POSITION)
        f.write(struct.pack(">q", 150_000))
    (root / "abort").touch()
    with mqstore.open(root, **SETTINGS) as store:
        assert store.put(Message(topic="T", body=b"new")).ok
        store.wait_for_messages("T", 0, 10, timeout_s=10)
    size = sum(f.stat().st_size for f in (root / "consumequeue" / "T" / "0").iterdir())
    assert size < 1 << 20, size


def test_an_open_with_nothing_to_re_dispatch_after_a_lost_tail_does_not_wait_for_the_index(tmp_path: Path) -> None:
    """Found while timing these tests: with the queues cut back to the log's end there is
    nothing to re-dispatch, and the index (whose newest file says 0 when no message had keys)
    was taken for behind: every such open waited DISPATCH_CATCH_UP_TIMEOUT_MS twice (10 s) and
    then opened "with its queues behind the log"."""
    root = tmp_path / "s"
    _lose_tail(root)
    with mqstore.open(root, **SETTINGS) as store:
        report = store.supervisor.recovery
        assert report is not None and report.dispatch_from == report.max_offset
        assert store.supervisor.ctx.read_view.view.indexed_end >= report.max_offset


@pytest.mark.parametrize("how", ["emptied", "chains torn"])
def test_keys_of_kept_messages_are_found_after_the_index_files_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The index files gone after a clean stop (the directory emptied by hand), or dropped by
    recovery because the newest file's entries past a lost tail could not be cut out (chains
    torn): the index is rebuilt from the log's start (or the last kept file). Before, recovery
    took the index for complete, nothing re-dispatched those messages, and their keys were gone."""
    from mqstore.storage.index import IndexFile

    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        offsets = [store.put(Message(topic="T", body=b"t%d" % i, keys=[f"k{i}"])).commitlog_offset for i in range(N)]
        assert store.wait_for_messages("T", 0, N - 1, timeout_s=10)
    if how == "emptied":
        for f in (root / "index").iterdir():
            f.unlink()
    else:
        with open(root / "commitlog" / ("%020d" % 0), "r+b") as f:
            f.seek(offsets[KEPT])
            f.write(b"\0" * (offsets[-1] + 256 - offsets[KEPT]))
        flushed_only_to(root, offsets[KEPT])
        monkeypatch.setattr(IndexFile, "truncate_entries_from", lambda self, phy_offset: False)
    with mqstore.open(root, **SETTINGS) as store:
        for i in (0, 57, KEPT - 1):
            assert [m.body for m in store.query("T", f"k{i}").messages] == [b"t%d" % i], i
