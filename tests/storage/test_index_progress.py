"""The index progress file (storage.index_progress): written whole, read back exactly, and any
bytes it cannot trust refused rather than half-read (a progress read too high loses keys)."""

from __future__ import annotations

import errno
from pathlib import Path

import msgpack
import pytest

from mqstore.storage.fs import RealFileSystem
from mqstore.storage.index_progress import (
    IndexProgress,
    IndexProgressError,
    load_index_progress,
    pack_index_progress,
    peek_index_progress,
    unpack_index_progress,
    write_index_progress,
)
from mqstore.storage.sealed import UnknownVersionError

PROGRESS = IndexProgress(1 << 41, (("20261124153106123", 0), ("20261124153107456", 123_456), ("20261124153108789", 1 << 40)))


def test_progress_reads_back_exactly() -> None:
    assert unpack_index_progress(pack_index_progress(PROGRESS)) == PROGRESS
    assert unpack_index_progress(pack_index_progress(IndexProgress(0, ()))) == IndexProgress(0, ())


def test_every_flipped_bit_is_refused() -> None:
    data = pack_index_progress(PROGRESS)
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises((IndexProgressError, UnknownVersionError)):  # (a raised version: see the ledger's)
            unpack_index_progress(bytes(damaged))


def _document(body: object, *, version: object = 1, fmt: str = "mqstore-index-progress") -> bytes:
    import zlib

    packed = msgpack.packb(body, use_bin_type=True)
    data: bytes = msgpack.packb({"format": fmt, "version": version, "progress": packed, "crc32": zlib.crc32(packed)},
                                use_bin_type=True)  # fmt: skip
    return data


@pytest.mark.parametrize(
    "data",
    [b"", b"\0" * 16, _document([5, []], fmt="mqstore-queue-ledger"), _document([5, []], version=0),
     _document([-1, []]), _document([True, []]), _document([5.0, []]), _document([5]), _document([5, [["x/../y", 1]]]),
     _document([5, [["123", -1]]]), _document([5, [["123"]]]), _document([5, "files"])],
    ids=["empty", "zeros", "other-format", "version-0", "negative", "bool", "float", "short", "path-name",
         "negative-end", "short-entry", "not-a-list"],
)  # fmt: skip
def test_bytes_that_are_not_a_progress_are_refused(data: bytes) -> None:
    with pytest.raises(IndexProgressError):
        unpack_index_progress(data)


def test_load_sets_a_damaged_progress_aside_and_says_nothing_is_known(tmp_path: Path) -> None:
    fs = RealFileSystem()
    path = tmp_path / "index_progress.msgpack"
    assert load_index_progress(fs, str(path)) is None  # none: a broker's store
    assert write_index_progress(fs, str(path), PROGRESS)
    assert load_index_progress(fs, str(path)) == PROGRESS
    damaged = pack_index_progress(PROGRESS)[:-3] + b"xyz"
    path.write_bytes(damaged)
    assert load_index_progress(fs, str(path)) is None
    assert not path.exists()
    assert (tmp_path / "index_progress.msgpack.damaged").read_bytes() == damaged


def test_a_newer_mqstores_progress_is_refused_and_left_in_place(tmp_path: Path) -> None:
    """Review 62 H2: set aside as damage before, and the open went on without it."""
    data = _document([5, [["123", 1]], "more"], version=2)
    with pytest.raises(UnknownVersionError, match="version 2, written by a newer mqstore.*reads version 1"):
        unpack_index_progress(data)
    path = tmp_path / "index_progress.msgpack"
    path.write_bytes(data)
    for read in (load_index_progress, peek_index_progress):
        with pytest.raises(UnknownVersionError, match=str(path)):
            read(RealFileSystem(), str(path))
    assert path.read_bytes() == data and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_failed_write_says_so_and_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = RealFileSystem()
    path = tmp_path / "index_progress.msgpack"
    assert write_index_progress(fs, str(path), PROGRESS)

    def full(_path: str, _data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fs, "write_atomic", full)
    assert not write_index_progress(fs, str(path), IndexProgress(1, ()))
    assert load_index_progress(RealFileSystem(), str(path)) == PROGRESS
