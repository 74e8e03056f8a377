"""The queue ledger's file (storage.queue_ledger): written whole, read back exactly, and any
bytes it cannot trust refused rather than half-read."""

from __future__ import annotations

import zlib
from pathlib import Path

import msgpack
import pytest

from mqstore.storage.fs import RealFileSystem
from mqstore.storage.queue_ledger import (
    LedgerFile,
    unpack_ledger_file,
    LedgerEntry,
    LedgerError,
    load_queue_ledger,
    pack_queue_ledger,
    peek_queue_ledger,
    unpack_queue_ledger,
    write_queue_ledger,
)
from mqstore.storage.sealed import UnknownVersionError

UNITS = {
    ("T", 0): LedgerEntry(120, 100),
    ("T", 3): LedgerEntry(0, 0),
    ("SCHEDULE_TOPIC_XXXX", 2): LedgerEntry(7, 0),
    ("%RETRY%g|x_y-z", 0x7FFFFFFF): LedgerEntry(1 << 40, 1 << 39),
    ("lost", 1): LedgerEntry(360, 0, 400),  # 40 queue offsets handed out to records now lost
}


def test_a_ledger_reads_back_exactly() -> None:
    assert unpack_queue_ledger(pack_queue_ledger(UNITS)) == UNITS
    assert unpack_queue_ledger(pack_queue_ledger({})) == {}


def test_cleaned_queues_floors_read_back_and_only_they_make_a_version_3_ledger() -> None:
    """Review 114 F1: the floors of queues clean_unused_topic removed are kept in the ledger
    (a crash's re-dispatch must not bring those queues back); a store that never cleaned one
    keeps a version 2 ledger, which the mqstore before them reads."""
    cleaned = {("Gone", 0): 4096, ("%RETRY%g", 3): 0}
    both = unpack_ledger_file(pack_queue_ledger(UNITS, cleaned))
    assert both == LedgerFile(UNITS, cleaned)
    assert msgpack.unpackb(pack_queue_ledger(UNITS, cleaned))["version"] == 3
    assert msgpack.unpackb(pack_queue_ledger(UNITS, {}))["version"] == 2
    assert unpack_ledger_file(pack_queue_ledger(UNITS)) == LedgerFile(UNITS, {})


def test_every_flipped_bit_is_refused() -> None:
    """As damage; or, where the flip raises the version (the CRC does not cover it), as a
    newer mqstore's file: refused either way, never read."""
    data = pack_queue_ledger(UNITS)
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises((LedgerError, UnknownVersionError)):
            unpack_queue_ledger(bytes(damaged))


def test_a_version_1_ledger_is_read_as_having_no_high_water() -> None:
    """Written by the mqstore before the high water; its queues continue after their units."""
    entries = unpack_queue_ledger(_document([["T", 0, 120, 100], ["U", 2, 7, 0]], version=1))
    assert entries == {("T", 0): LedgerEntry(120, 100, 0), ("U", 2): LedgerEntry(7, 0, 0)}
    assert entries[("T", 0)].next_offset == 120
    assert UNITS[("lost", 1)].next_offset == 400


def _document(queues: object, *, version: object = 2) -> bytes:
    body = msgpack.packb(queues, use_bin_type=True)
    return msgpack.packb(
        {"format": "mqstore-queue-ledger", "version": version, "queues": body, "crc32": zlib.crc32(body)},
        use_bin_type=True,
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00" * 64,
        msgpack.packb({"format": "something else"}),
        _document([["T", 0, 1, 0, 0]], version=True),
        _document([["T", 0, 1, 0, 0]], version=0),
        _document([["T", 0, 1, 0, 0]], version="3"),
        _document([["T", 0, 1, 0]], version=2),  # a version 2 entry has its high water
        _document([["T", 0, 1, 0, 0]], version=1),
        _document([["T", 0, 1, 0, -1]]),
        _document([["T", 0, 1, 0, 2.5]]),
        _document([["../../etc", 0, 1, 0, 0]]),  # a topic is a path: never one that leaves consumequeue/
        _document([["T/0", 0, 1, 0, 0]]),
        _document([["", 0, 1, 0, 0]]),
        _document([["T" * 128, 0, 1, 0, 0]]),
        _document([["T", -1, 1, 0, 0]]),
        _document([["T", 1 << 31, 1, 0, 0]]),
        _document([["T", 0, -5, 0, 0]]),
        _document([["T", 0, True, 0, 0]]),
        _document([["T", 0, 1]]),
        _document({"T": 1}),
        _document([["T", 0, 1, -1, 0]]),
    ],
    ids=["empty", "zeros", "other-format", "bool-version", "version-0", "str-version", "v2-short", "v1-long", "negative-high-water",
         "float-high-water", "dotdot", "slash", "empty-topic", "long-topic",
         "negative-queue", "queue-too-big", "negative-count", "bool-count", "short-entry", "not-a-list", "negative-first"],  # fmt: skip
)
def test_bytes_that_are_not_a_ledger_are_refused(data: bytes) -> None:
    with pytest.raises(LedgerError):
        unpack_queue_ledger(data)


def test_load_sets_a_damaged_ledger_aside_and_says_nothing_is_known(tmp_path: Path) -> None:
    fs = RealFileSystem()
    path = tmp_path / "queue_ledger.msgpack"
    assert load_queue_ledger(fs, str(path)) is None  # no ledger: a broker's store
    write_queue_ledger(fs, str(path), UNITS, cleaned={})
    assert load_queue_ledger(fs, str(path)) == UNITS
    damaged = pack_queue_ledger(UNITS)[:-3] + b"xyz"
    path.write_bytes(damaged)
    assert load_queue_ledger(fs, str(path)) is None
    assert not path.exists()
    assert (tmp_path / "queue_ledger.msgpack.damaged").read_bytes() == damaged  # kept for a person


@pytest.mark.parametrize("content", [[["T", 0, 1, 0, 0, "more"]], {"queues": "laid out otherwise"}])
def test_a_newer_mqstores_ledger_is_refused_and_left_in_place(tmp_path: Path, content: object) -> None:
    """Review 62 H2: a newer version's ledger was taken for damage, set aside, and the open
    went on without the queue offsets it reserves. It is refused, named, and left as it is;
    the read-only peek says so too instead of answering "no ledger"."""
    data = _document(content, version=4)
    with pytest.raises(UnknownVersionError, match="version 4, written by a newer mqstore.*reads versions 1-3"):
        unpack_queue_ledger(data)
    path = tmp_path / "queue_ledger.msgpack"
    path.write_bytes(data)
    fs = RealFileSystem()
    for read in (load_queue_ledger, peek_queue_ledger):
        with pytest.raises(UnknownVersionError, match=str(path)) as refused:
            read(fs, str(path))
        assert refused.value.version == 4 and refused.value.path == str(path)
    assert path.read_bytes() == data and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_ledger_the_process_cannot_read_refuses_the_open_and_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 122 F4: an unreadable ledger (EACCES) was taken for no ledger: the open went on
    without the floors of the queues clean_unused_topic removed, served their old records at
    the offsets acknowledged since, and wrote a ledger without the floors."""
    import errno

    import mqstore
    from mqstore.storage.fs import RealFileSystem

    root = tmp_path / "s"
    with mqstore.open(root) as store:
        assert store.put(mqstore.Message(topic="A", body=b"a")).ok
        assert store.put(mqstore.Message(topic="B", body=b"old")).ok
        assert store.clean_unused_topic(["A"]) == 1
        assert store.put(mqstore.Message(topic="B", body=b"new")).ok
    ledger = root / "queue_ledger.msgpack"
    before = ledger.read_bytes()
    read_bytes = RealFileSystem.read_bytes

    def denied(self: RealFileSystem, path: str) -> bytes:
        if path.endswith("queue_ledger.msgpack"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return read_bytes(self, path)

    monkeypatch.setattr(RealFileSystem, "read_bytes", denied)
    with pytest.raises(Exception) as refused:
        mqstore.open(root)
    assert "queue_ledger.msgpack" in str(refused.value) and "Permission denied" in str(refused.value), repr(refused.value)
    monkeypatch.undo()
    assert ledger.read_bytes() == before
    with mqstore.open(root) as store:
        assert [m.body for m in store.get("B", 0, 0, 8).messages] == [b"new"]
