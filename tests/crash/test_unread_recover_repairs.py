"""`mqstore recover`'s repairs read a segment through a map and write what they read: filling a
wrong-sized segment from its set-aside copy (its valid records measured, then copied into a new
segment), and keeping a copy of a segment before a blank record ends it. A page of the source
that faults (an I/O error, or the file cut short meanwhile) reads as the SIGBUS guard's zeros.
Review 67 F6: taken for the end of the valid records (or copied as them), 52 acknowledged
messages were declared lost and left out of the new segment, exit 0; and the copy kept before
the overwrite held zeros where the bytes were. Now recover refuses (exit 1, EIO, the file named)
and changes nothing; once the file reads whole it repairs as without the fault.

The fault is made for real: the source is cut short after it is mapped and before (or while)
it is read, and its bytes are written back right after."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import cli
from mqstore.storage import mapguard, recovery
from mqstore.storage.fs import RealMappedRegion

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built: a fault would kill the run")

SEG = 64 * 1024


def _hashes(store: Path) -> dict[str, str]:
    return {str(p.relative_to(store)): hashlib.sha1(p.read_bytes()).hexdigest() for p in store.rglob("*") if p.is_file()}


def _fill(store: Path, n: int) -> None:
    with mqstore.open(store, mapped_file_size_commitlog_bytes=SEG) as s:
        for i in range(n):
            assert s.put(mqstore.Message(topic="t", body=bytes([65 + i % 26]) * 1000)).ok


def _bodies(store: Path) -> list[bytes]:
    with mqstore.open(store, mapped_file_size_commitlog_bytes=SEG) as s:
        got: list[bytes] = []
        offset = 0
        while offset < s.max_offset("t", 0):
            r = s.get("t", 0, offset, 32)
            assert r.next_begin_offset > offset, r
            got += [m.body for m in r.messages]
            offset = r.next_begin_offset
        return got


class _Cut:
    """`path` cut short now (a mapped file's pages past 8 KiB fault); `restore` gives the file its
    bytes back, under whatever name it has by then."""

    def __init__(self, path: Path) -> None:
        self.saved = path.read_bytes()
        self.fd = os.open(path, os.O_RDWR)
        os.ftruncate(self.fd, 8192)

    def restore(self) -> None:
        if self.fd >= 0:
            os.pwrite(self.fd, self.saved, 0)
            os.close(self.fd)
            self.fd = -1


@pytest.mark.parametrize("when", ["measured", "copied"])
def test_recover_refuses_to_fill_a_segment_from_a_copy_whose_page_faults_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], when: str
) -> None:
    store = tmp_path / "store"
    _fill(store, 150)
    segment = sorted((store / "commitlog").iterdir())[1]
    with open(segment, "r+b") as f:
        f.truncate(SEG - 100)  # wrong-sized (its last 100 bytes were unwritten zeros): no record lost
    before = _hashes(store)
    monkeypatch.setenv("MQSTORE_MAPPED_FILE_SIZE_COMMITLOG_BYTES", str(SEG))
    control = tmp_path / "control"  # the same store, repaired without a fault
    shutil.copytree(store, control)
    assert cli.main(["recover", "--json", str(control)]) == 0
    expected = json.loads(capsys.readouterr().out)
    measure = recovery.valid_prefix_end
    cuts: list[_Cut] = []

    def cut_while_it_reads(buf: Any, *args: Any) -> int:
        copy = segment.parent / (segment.name + ".damaged")
        if when == "measured":
            cuts.append(_Cut(copy))
            try:
                return measure(buf, *args)
            finally:
                cuts[0].restore()
        end = measure(buf, *args)
        cuts.append(_Cut(copy))  # restored once recover is done: its copy loop reads zeros
        return end

    monkeypatch.setattr(recovery, "valid_prefix_end", cut_while_it_reads)
    faults = mapguard.total_faults()
    assert cli.main(["recover", str(store)]) == 1
    for cut in cuts:
        cut.restore()
    said = capsys.readouterr().err
    assert mapguard.total_faults() > faults
    assert "could not be read" in said and segment.name in said, said
    assert _hashes(store) == before  # no segment written, the wrong-sized one back in its place
    monkeypatch.setattr(recovery, "valid_prefix_end", measure)
    assert cli.main(["recover", "--json", str(store)]) == 0
    repaired = json.loads(capsys.readouterr().out)
    assert repaired["lost_ranges"] == expected["lost_ranges"] and len(repaired["lost_ranges"]) == 1
    assert repaired["filled_commitlog_files"] == expected["filled_commitlog_files"]
    assert _bodies(store) == _bodies(control)


@pytest.mark.parametrize("when", ["faults_in_the_copy", "faulted_before_the_copy"])
def test_recover_refuses_to_end_a_segment_whose_copy_could_not_read_a_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], when: str
) -> None:
    """A clean store whose last record has a flipped byte: `recover` keeps a copy of the segment
    and ends it there with a blank record. The copy is written from the map: a page that faults
    in the write is EFAULT; one that faulted before reads as the guard's zeros, copied as the
    segment's bytes."""
    store = tmp_path / "store"
    _fill(store, 20)
    segment = sorted((store / "commitlog").iterdir())[0]
    with mqstore.open(store, mapped_file_size_commitlog_bytes=SEG) as s:
        last = s.get("t", 0, 19, 1).messages[0].commitlog_offset
    data = bytearray(segment.read_bytes())
    data[last + 200] ^= 0xFF  # in the last record's body: its CRC fails
    segment.write_bytes(bytes(data))
    before = _hashes(store)
    monkeypatch.setenv("MQSTORE_MAPPED_FILE_SIZE_COMMITLOG_BYTES", str(SEG))
    save_copy = RealMappedRegion.save_copy
    cuts: list[_Cut] = []

    def cut_while_it_copies(self: RealMappedRegion, path: str, length: int) -> None:
        cuts.append(_Cut(segment))
        try:
            if when == "faulted_before_the_copy":
                assert self.buf[3 * 4096] == 0 and self.cut_short()  # the guard's zeros from 8 KiB on
            save_copy(self, path, length)
        finally:
            cuts[0].restore()

    monkeypatch.setattr(RealMappedRegion, "save_copy", cut_while_it_copies)
    assert cli.main(["recover", str(store)]) == 1
    said = capsys.readouterr().err
    assert cuts and "could not be read" in said and segment.name in said, said
    assert _hashes(store) == before  # no copy left, no blank written
    monkeypatch.setattr(RealMappedRegion, "save_copy", save_copy)
    assert cli.main(["recover", str(store)]) == 3  # the damage, reported as before
    kept = segment.parent / (segment.name + ".damaged")
    assert kept.read_bytes().rstrip(b"\0") == bytes(data).rstrip(b"\0")
    assert len(_bodies(store)) == 19
