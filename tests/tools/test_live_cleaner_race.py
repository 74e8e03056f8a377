"""Read-only commands on a running store whose cleaner removes the log's head while they read
(review 53 M2, M3): a file listed and then gone is no longer the store's, not damage. `stats`
failed on FileNotFoundError (exit 1); `dump --what commitlog` said "corrupt record" (exit 3)
or "is in the way" (exit 5) on a healthy store. Each test removes the head segment between a
command's listing and its reads, as the cleaner does, deterministically."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import cli
from mqstore.cli import main
from mqstore.config import StoreConfig
from mqstore.storage.commitlog import RecordKind, scan_commitlog_dir
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.geometry import detect_geometry
from mqstore.tools import inspect_cli

SMALL = dict(mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=20 * 40,
             max_hash_slot_num=100, max_index_num=400)  # fmt: skip
MESSAGES = 600


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "s"
    with mqstore.open(path, **SMALL) as s:
        for i in range(MESSAGES):
            assert s.put(mqstore.Message("T", b"%05d" % i + b"." * 300)).ok
    assert len(os.listdir(path / "commitlog")) >= 4 and len(os.listdir(path / "consumequeue" / "T" / "0")) >= 4
    return path


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def head_removed_after_listing(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Path]:
    """Wrap `module.name` (a listing of segment files) so that each directory's first listed
    file is removed right after it is listed, once: what the cleaner does meanwhile."""
    real = getattr(module, name)
    removed: list[Path] = []

    def listing(directory: Path, *args: Any) -> Any:
        found = real(directory, *args)
        files = found[0] if isinstance(found, tuple) else found
        if files and files[0].parent not in [p.parent for p in removed]:
            files[0].unlink()
            removed.append(files[0])
        return found

    monkeypatch.setattr(module, name, listing)
    return removed


def test_stats_while_the_cleaner_removes_the_head_of_the_log_and_of_a_queue(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    removed = head_removed_after_listing(monkeypatch, inspect_cli, "_segment_files")
    code, out, err = run_cli("stats", "--json", str(store))
    assert code == 0, err
    figures = json.loads(out)
    assert {p.parent.name for p in removed} >= {"commitlog", "0"}
    left = sorted(os.listdir(store / "commitlog"))
    assert figures["commitlog"]["min_offset"] == int(left[0]) and figures["commitlog"]["segments"] == len(left)
    assert figures["commitlog"]["segment_size"] == SMALL["mapped_file_size_commitlog_bytes"]
    queue = figures["queues"][0]
    assert queue["max_offset"] == MESSAGES and 0 < queue["min_offset"] < MESSAGES


def test_dump_of_the_commitlog_while_the_cleaner_removes_its_head(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    removed = head_removed_after_listing(monkeypatch, cli, "segment_layout")
    code, out, err = run_cli("dump", str(store), "--what", "commitlog")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(removed) == 1 and rows and rows[-1]["queue_offset"] == MESSAGES - 1
    assert rows[0]["commitlog_offset"] == int(sorted(os.listdir(store / "commitlog"))[0])
    assert [r["queue_offset"] for r in rows] == list(range(rows[0]["queue_offset"], MESSAGES))


class RemovesAfterListing(RealFileSystem):
    """Its first listing is the scan's: the `nth` segment goes right after it (the head: as the
    cleaner's delete would); later listings (the scan asking again) see what is left."""

    def __init__(self, nth: int = 0) -> None:
        super().__init__()
        self.nth, self.listed = nth, False

    def listdir(self, path: str) -> list[str]:
        names = sorted(super().listdir(path))
        if not self.listed:
            self.listed = True
            os.remove(os.path.join(path, names[self.nth]))
        return names


def test_the_tools_scan_skips_head_segments_removed_after_its_listing_and_reports_a_hole(store: Path) -> None:
    directory = str(store / "commitlog")
    reads = list(scan_commitlog_dir(directory, fs=RemovesAfterListing(), segment_size=64 * 1024))
    assert reads and all(r.kind is not RecordKind.CORRUPT for r in reads)
    assert reads[0].offset == int(sorted(os.listdir(directory))[0])
    # A segment gone from the middle of the log is a hole still, not the cleaner's work.
    names = sorted(os.listdir(directory))
    reads = list(scan_commitlog_dir(directory, fs=RemovesAfterListing(1), segment_size=64 * 1024))
    assert [r.offset for r in reads if r.kind is RecordKind.CORRUPT] == [int(names[1])]


def test_the_tools_scan_skips_segments_the_cleaner_removes_while_it_reads(store: Path) -> None:
    """Review 56 M1: a dump read slowly (its output piped to a slow reader) met segments the
    cleaner removed after it had read the first one: 'corrupt record', exit 3. A segment found
    gone is skipped when the directory, listed again, holds only later ones."""
    directory = str(store / "commitlog")
    names = sorted(os.listdir(directory))
    reads = scan_commitlog_dir(directory, segment_size=64 * 1024)
    first = next(reads)
    assert first.offset == 0
    for name in names[:3]:  # the cleaner catches up with the reader: its file and the next two
        os.remove(os.path.join(directory, name))
    rest = list(reads)
    assert rest and all(r.kind is not RecordKind.CORRUPT for r in rest)
    # (the first segment, mapped before it went, is read to its end)
    assert not any(int(names[1]) <= r.offset < int(names[3]) for r in rest)
    assert any(r.offset >= int(names[3]) for r in rest)


def test_a_head_segment_that_is_a_link_to_nothing_is_damage_not_expired(store: Path) -> None:
    """Review 56 H1: a symbolic link to nothing, listed as the first segment, was taken for a
    segment the cleaner had removed and dropped without a word."""
    directory = store / "commitlog"
    head = directory / sorted(os.listdir(directory))[0]
    head.unlink()
    head.symlink_to(directory / "nowhere")
    reads = list(scan_commitlog_dir(str(directory), segment_size=64 * 1024))
    assert reads[0].kind is RecordKind.CORRUPT and reads[0].offset == int(head.name)
    code, out, err = run_cli("stats", "--json", str(store))
    assert code == 0 and json.loads(out)["commitlog"]["min_offset"] != int(head.name)  # (stats lists regular files)


class RemovesHeadsAfterListing(RealFileSystem):
    """The oldest file of each of `directories` goes right after its first listing (as the
    cleaner's delete would)."""

    def __init__(self, directories: list[Path]) -> None:
        super().__init__()
        self.left = {str(d) for d in directories}

    def listdir(self, path: str) -> list[str]:
        names = super().listdir(path)
        if path in self.left:
            self.left.discard(path)
            os.remove(os.path.join(path, min(n for n in names if n.isdigit())))
        return names


def test_the_geometry_of_a_store_whose_cleaner_removes_heads_meanwhile(store: Path) -> None:
    """A listed file gone when the geometry asked its length: a queue's or the index's failed
    every read-only command with FileNotFoundError (exit 1), a segment was warned of as damage
    (review 53's live runs, beside L1). Files gone are left out."""
    with mqstore.open(store, **SMALL) as s:  # a second index file, so the index has a head to lose
        for i in range(500):
            assert s.put(mqstore.Message("T", b"k", keys=[f"k{i}"])).ok
    directories = [store / "commitlog", store / "consumequeue" / "T" / "0", store / "index"]
    assert all(len(os.listdir(d)) >= 2 for d in directories)
    config = StoreConfig.load(overrides={"store_path_root_dir": str(store)})
    geometry = detect_geometry(RemovesHeadsAfterListing(directories), config)
    assert geometry.odd_files == ()
    assert geometry.settings() == SMALL


class RemovesIndexHeadWhenMapped(RealFileSystem):
    """The oldest index file goes when it is first mapped (after its header was read): the
    cleaner's delete between the geometry's steps."""

    def __init__(self, head: str) -> None:
        super().__init__()
        self.head: str | None = head

    def map_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
        if path == self.head:
            self.head = None
            os.remove(path)
        return super().map_file(path, *args, **kwargs)


def test_the_index_geometry_when_the_cleaner_removes_its_head_between_the_header_and_the_walk(store: Path) -> None:
    """Review 130 F4: the oldest index file deleted after its header was read and before its
    entries were walked failed `stats`, `inspect` and `dump` with a bare FileNotFoundError
    (17 of 1,872 calls against a live store). A file gone tells nothing of the geometry."""
    with mqstore.open(store, **SMALL) as s:  # a second index file, so the index has a head to lose
        for i in range(500):
            assert s.put(mqstore.Message("T", b"k", keys=[f"k{i}"])).ok
    index_files = sorted((store / "index").iterdir())
    assert len(index_files) >= 2
    config = StoreConfig.load(overrides={"store_path_root_dir": str(store)})
    geometry = detect_geometry(RemovesIndexHeadWhenMapped(str(index_files[0])), config)
    assert not index_files[0].exists()
    assert geometry.settings() == SMALL
