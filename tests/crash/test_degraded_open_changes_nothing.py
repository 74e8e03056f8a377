"""A store whose segments are cut short or missing (a copy interrupted part-way, a segment
deleted by hand) opens degraded at the size the caller sets: reads serve what is there, puts are
refused, and no byte of the store changes. Above all no ConsumeQueue unit and no index entry
into the missing bytes is cut: once the segments are put back whole, every acknowledged message
is served again (review 32 P1: with every segment cut short, the open took the log for gone,
destroyed every queue, and the restored store served none of its 1200 messages)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from crashlib import read_all

import mqstore
from mqstore import Message
from mqstore.actors import cleaner as cleaner_module
from mqstore.messages import CleanRound, Tick
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.queue_ledger import LedgerEntry, load_queue_ledger
from mqstore.storage.status import PutMessageStatus

SEGMENT = 64 * 1024
COUNT = 1200
# Small queue and index files: the cleaner has whole files of the first segment's to delete.
SETTINGS = {"mapped_file_size_commitlog_bytes": SEGMENT, "allocate_wait_timeout_ms": 200,
            "mapped_file_size_consume_queue_bytes": 600, "max_hash_slot_num": 64, "max_index_num": 200}
# The lock and abort marker of the open itself, its stats, and the queue ledger: every open
# writes the ledger at its first tick (each queue's units, floors never lowered, checked below).
UNTOUCHED_BY_DESIGN = {"lock", "abort", "stats.msgpack", "queue_ledger.msgpack"}


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in UNTOUCHED_BY_DESIGN}  # fmt: skip


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("degraded") / "source"
    with mqstore.open(source, **SETTINGS) as store:
        for i in range(COUNT):
            assert store.put(Message("T", b"m%04d" % i + b"." * 150, keys=[f"k{i}"])).ok
    assert len(os.listdir(source / "commitlog")) == 5
    return source


def _ledger(root: Path) -> dict[tuple[str, int], LedgerEntry]:
    return load_queue_ledger(RealFileSystem(), str(root / "queue_ledger.msgpack")) or {}


def _walk(store: mqstore.MessageStore) -> list[bytes]:
    """The first bytes of every message of T-0, every get FOUND (crashlib.read_all)."""
    return [m.body[:5] for m in read_all(store, "T", 0)]


@pytest.mark.parametrize("damage", ["every segment cut", "first cut", "last cut", "last deleted",
                                    "every segment cut, after a crash", "last cut, a broker's checkpoint",
                                    "first cut, a broker's checkpoint"])  # fmt: skip
def test_a_degraded_open_cuts_no_unit_and_the_restored_store_serves_everything(
    written: Path, tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "copy"
    shutil.copytree(written, path)
    names = sorted(os.listdir(path / "commitlog"))
    crashed = damage.endswith("after a crash")
    if crashed:
        (path / "abort").write_bytes(b"")
    if damage.endswith("a broker's checkpoint"):
        # Its three timestamps only (review 104 F5, 105 G3: the open wrote mqstore's flushed
        # offset into it, a byte changed by a degraded open).
        cp = path / "checkpoint"
        cp.write_bytes(cp.read_bytes()[:24].ljust(4096, b"\0"))
    if damage.startswith("every segment cut"):
        for i, name in enumerate(names):  # cut at a copier's chunk boundary, never whole
            os.truncate(path / "commitlog" / name, 8192 * (i + 1))
    elif damage.startswith("first cut"):
        os.truncate(path / "commitlog" / names[0], 8192)
    elif damage.startswith("last cut"):
        os.truncate(path / "commitlog" / names[-1], 8192)
    else:
        os.unlink(path / "commitlog" / names[-1])
    before = _digest(path)
    ledger_before = _ledger(path)

    with mqstore.open(path, **SETTINGS) as store:
        if not crashed:
            first = store.get("T", 0, 0, 32)
            bodies = [m.body[:5] for m in first.messages]  # a get stops at a queue file's end
            assert len(bodies) >= 16 and bodies == [b"m%04d" % i for i in range(len(bodies))]
            assert store.max_offset("T", 0) == COUNT  # no unit cut, none handed out again
        assert store.put(Message("T", b"x")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    after = _digest(path)
    if crashed:
        # The crash rule cuts the units and drops the index files that were not full (a power
        # loss may have torn them); re-dispatch rebuilds them up to the first hole here, and
        # the rest once the segments are back (checked below). The log itself is untouched.
        before = {k: v for k, v in before.items() if k.startswith("commitlog")}
        after = {k: v for k, v in after.items() if k.startswith("commitlog")}
    assert after == before
    ledger_after = _ledger(path)
    assert ledger_after.keys() == ledger_before.keys()
    for key, entry in ledger_before.items():
        if crashed:  # units cut for re-dispatch: their queue offsets stay taken
            assert max(ledger_after[key].units, ledger_after[key].high_water) >= entry.units
            continue
        assert ledger_after[key].units >= entry.units and ledger_after[key].first == entry.first
        assert ledger_after[key].high_water == entry.high_water  # no queue offset given up

    for name in names:  # the copy finishes
        shutil.copyfile(written / "commitlog" / name, path / "commitlog" / name)
    with mqstore.open(path, **SETTINGS) as store:
        assert _walk(store) == [b"m%04d" % i for i in range(COUNT)]
        assert store.max_offset("T", 0) == COUNT
        missed = [i for i in range(0, COUNT, 37) if [m.body[:5] for m in store.query("T", f"k{i}").messages] != [b"m%04d" % i]]
        assert missed == []
        assert store.put(Message("T", b"after")).queue_offset == COUNT


def test_the_cleaner_deletes_no_queue_or_index_file_for_a_segment_cut_short(
    written: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleaner follows the log's head: with the first segment cut short (left out of the
    loaded files), the head looked like the second segment's start, and the first round deleted
    the queue and index files of the first segment's messages; restored, 240 of them were out
    of reach of get and their keys of query."""
    path = tmp_path / "copy"
    shutil.copytree(written, path)
    first = sorted(os.listdir(path / "commitlog"))[0]
    os.truncate(path / "commitlog" / first, 8192)
    before = _digest(path)
    now = [2_000_000_000_000]
    monkeypatch.setattr(cleaner_module, "CLEAN_FIRST_DELAY_MS", 0)  # (a minute of the monotonic clock)
    with mqstore.open(path, clock_ms=lambda: now[0], **SETTINGS) as store:
        now[0] += 1_000
        round_: CleanRound = store.supervisor.ctx.peers["cleaner"].ask(Tick(now_ms=now[0]), timeout=30)
        assert round_.ran and (round_.consume_queue_deleted, round_.index_deleted) == (0, 0), round_
        assert store.min_offset("T", 0) == 0
    assert _digest(path) == before
    shutil.copyfile(written / "commitlog" / first, path / "commitlog" / first)
    with mqstore.open(path, **SETTINGS) as store:
        assert _walk(store) == [b"m%04d" % i for i in range(COUNT)]
        assert all(store.query("T", f"k{i}").messages for i in range(0, COUNT, 37))


def test_after_a_crash_torn_units_are_rebuilt_and_dispatch_waits_at_a_hole(written: Path, tmp_path: Path) -> None:
    """Review 34 F1/F2. After a crash, units from the re-dispatch start are rebuilt even when
    the log has a hole (a power loss can leave a queue file zeroed with later ones intact, and
    re-dispatch skips what a queue seems to hold); dispatch stops at the hole instead of going
    on past it, so no key of the hole's messages is left out of the index for good and no
    filler unit takes their queue offsets. The close is then unclean, and the open after the
    segment is back re-dispatches across it."""
    path = tmp_path / "copy"
    shutil.copytree(written, path)
    (path / "abort").write_bytes(b"")
    os.unlink(path / "checkpoint")  # no checkpoint: the crash scan starts at the log's start
    zeroed = path / "consumequeue" / "T" / "0" / f"{30 * 20 * 10:020d}"  # units 300-329
    zeroed.write_bytes(bytes(zeroed.stat().st_size))
    names = sorted(os.listdir(path / "commitlog"))
    os.truncate(path / "commitlog" / names[3], 4096)  # records ~1010-1330 of 1200... and on

    with mqstore.open(path, **SETTINGS) as store:
        got = store.get("T", 0, 300, 30)
        assert [m.body[:5] for m in got.messages] == [b"m%04d" % i for i in range(300, 330)]
        assert store.put(Message("T", b"x")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert (path / "abort").exists()  # dispatch stopped at the hole: the next open re-dispatches

    shutil.copyfile(written / "commitlog" / names[3], path / "commitlog" / names[3])
    with mqstore.open(path, **SETTINGS) as store:
        assert _walk(store) == [b"m%04d" % i for i in range(COUNT)]
        missed = [i for i in range(COUNT) if [m.body[:5] for m in store.query("T", f"k{i}").messages] != [b"m%04d" % i]]
        assert missed == []
        assert store.put(Message("T", b"after")).queue_offset == COUNT


@pytest.mark.parametrize("cut_to", [0, 100])
def test_a_first_segment_with_nothing_readable_is_a_hole_not_a_cleaned_file(written: Path, tmp_path: Path, cut_to: int) -> None:
    """Review 36 F1: emptied, or cut inside its first record, the first segment was taken for
    one the cleaner removed: re-dispatch after a crash went on at the second segment, the close
    was clean, and once the segment was back its 255 messages were never served again."""
    path = tmp_path / "copy"
    shutil.copytree(written, path)
    (path / "abort").write_bytes(b"")
    shutil.rmtree(path / "consumequeue")
    first = sorted(os.listdir(path / "commitlog"))[0]
    os.truncate(path / "commitlog" / first, cut_to)
    store = mqstore.open(path, **SETTINGS)
    assert store.put(Message("T", b"x")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert store.close() is False and (path / "abort").exists()  # dispatch waits at the hole
    shutil.copyfile(written / "commitlog" / first, path / "commitlog" / first)
    with mqstore.open(path, **SETTINGS) as store:
        assert _walk(store) == [b"m%04d" % i for i in range(COUNT)]


def test_a_quarantine_recovery_drew_across_a_missing_segment_does_not_carry_dispatch_past_it(tmp_path: Path) -> None:
    """Review 36 F2: a damaged last record of a segment, its end-of-file blank damaged too, and
    the next segment missing: recovery's quarantine ran to the end of the missing segment, and
    re-dispatch skipped it whole, giving the hole's queue offsets filler units."""
    segment = 8 * 1024
    settings = {"mapped_file_size_commitlog_bytes": segment, "mapped_file_size_consume_queue_bytes": 20 * 200}
    root = tmp_path / "s"
    with mqstore.open(root, **settings) as store:
        offsets = [store.put(Message("q", b"%05d" % i * 20, keys=[f"k{i}"])).commitlog_offset for i in range(400)]
    names = sorted(os.listdir(root / "commitlog"))
    third = int(names[3])
    last = max(i for i, o in enumerate(offsets) if third <= o < third + segment)
    path = root / "commitlog" / names[3]
    data = bytearray(path.read_bytes())
    at = offsets[last] - third
    body_at = data.index(b"%05d" % last * 20, at)
    data[body_at + 3] ^= 1  # the body's CRC fails
    data[at + (offsets[last] - offsets[last - 1]) + 4 : at + (offsets[last] - offsets[last - 1]) + 8] = b"\0\0\0\1"
    path.write_bytes(bytes(data))
    saved = (root / "commitlog" / names[4]).read_bytes()
    (root / "commitlog" / names[4]).unlink()
    (root / "abort").write_bytes(b"")
    shutil.rmtree(root / "consumequeue")
    store = mqstore.open(root, **settings)
    assert store.close() is False
    (root / "commitlog" / names[4]).write_bytes(saved)
    in_the_hole = [i for i, o in enumerate(offsets) if int(names[4]) <= o < int(names[4]) + segment]
    with mqstore.open(root, **settings) as store:
        for i in in_the_hole:
            got = store.get("q", 0, i, 1)
            assert [m.body for m in got.messages] == [b"%05d" % i * 20], (i, got.status)
            assert [m.body for m in store.query("q", f"k{i}").messages] == [b"%05d" % i * 20]


def test_a_degraded_open_with_the_index_off_changes_nothing_either(written: Path, tmp_path: Path) -> None:
    """Review 36 F3: the index's recovery at an open with the index off lowered the progress to
    the end of a cut-short last segment."""
    path = tmp_path / "copy"
    shutil.copytree(written, path)
    names = sorted(os.listdir(path / "commitlog"))
    os.truncate(path / "commitlog" / names[-1], 8192)
    before = _digest(path)
    with mqstore.open(path, **SETTINGS, message_index_enable=False) as store:
        assert store.put(Message("T", b"x")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert _digest(path) == before


def test_a_store_whose_hole_goes_away_while_it_runs_records_its_new_puts_in_the_checkpoint(tmp_path: Path) -> None:
    """Review 106 H1: the flush actor of a store degraded at its open wrote no checkpoint for
    the rest of the run; when the hole went away (the cleaner deleted the expired segment
    before it), puts were taken again, SYNC_FLUSH answered, and after a crash with one bad
    byte recovery trusted the old checkpoint and cut 50 of 60 of them. Once the log grows past
    its end at the open, the checkpoint follows it again."""
    import time

    from mqstore.storage.checkpoint import CheckpointValues

    settings = dict(mapped_file_size_commitlog_bytes=8192, flush_disk_type="SYNC_FLUSH")
    path = tmp_path / "s"
    with mqstore.open(path, **settings) as store:
        for i in range(150):
            assert store.put(Message("T", b"m%04d" % i + b"." * 150)).ok
    names = sorted(os.listdir(path / "commitlog"))
    os.unlink(path / "commitlog" / names[1])  # a hole: degraded
    old = time.time() - 100 * 3600
    os.utime(path / "commitlog" / names[0], (old, old))  # the segment before it expired
    with mqstore.open(path, **settings) as store:
        assert store.put(Message("T", b"refused")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        store.delete_expired_files_now()  # the hole is gone with it
        last = [store.put(Message("T", b"new%04d" % i)) for i in range(20)][-1]
        assert last.ok, last
        store.flush()
        values = CheckpointValues.unpack((path / "checkpoint").read_bytes())
        assert values.physic_flushed_offset is not None
        assert values.physic_flushed_offset >= last.commitlog_offset + last.wrote_bytes, values
