"""The allocator makes segments ahead without a name; the writer names each when it takes it
(review 78 H1, the exposure left after the warm-up went). Before, the allocator made them under
their segment names: a writer that made a segment itself (the allocator slow, paused, or
stopping) shared or lost the file of that name, since the allocator's release deleted by name
what it had made ahead, and its failed map removed the name it had just created."""

from __future__ import annotations

import errno
import logging
import os
import stat
import sys
from pathlib import Path

import pykka
import pytest

import mqstore
from mqstore import FaultPlan, Message
from mqstore.faults import HoldAt
from mqstore.actors.allocator import AllocateMappedFileService
from mqstore.messages import AllocateRequest, Reply
from mqstore.storage.fs import FileSystem, RealFileSystem, SimulatedFileSystem
from mqstore.storage.codec import segment_file_name
from mqstore.storage.mapped_file import MappedFile

helpers = sys.modules["mqstore_actor_test_helpers"]
SIZE = 64 * 1024


def _fs(kind: str, tmp_path: Path) -> tuple[FileSystem, str]:
    if kind == "real":
        return RealFileSystem(), str(tmp_path / "commitlog")
    fs = SimulatedFileSystem()
    fs.makedirs("/sim/commitlog")
    return fs, "/sim/commitlog"


def _allocator(store: mqstore.MessageStore, fs: FileSystem) -> AllocateMappedFileService:
    """An allocator beside the store's (never started: its handle and release are called here),
    on the file system under test."""
    ctx = store.supervisor.ctx
    return AllocateMappedFileService(type(ctx)(config=ctx.config, fs=fs, clock_ms=ctx.clock_ms, faults=FaultPlan(),
                                               report=ctx.report))  # fmt: skip


def _request(allocator: AllocateMappedFileService, directory: str, segment: int) -> MappedFile:
    future: pykka.ThreadingFuture[object] = pykka.ThreadingFuture()
    allocator.handle(AllocateRequest(
        next_path=os.path.join(directory, segment_file_name(segment * SIZE)),
        next_next_path=os.path.join(directory, segment_file_name((segment + 1) * SIZE)),
        file_size=SIZE, reply=Reply(future=future),
    ))  # fmt: skip
    mapped = future.get(timeout=5)
    assert isinstance(mapped, MappedFile)
    return mapped


@pytest.mark.parametrize("kind", ["real", "simulated"])
def test_files_made_ahead_have_no_name_until_taken_and_their_release_deletes_nothing(tmp_path: Path, kind: str) -> None:
    fs, directory = _fs(kind, tmp_path)
    with helpers.open_small(tmp_path / "store") as store:
        allocator = _allocator(store, fs)
        first = _request(allocator, directory, 0)  # and the second made ahead
        second = os.path.join(directory, segment_file_name(SIZE))
        assert fs.listdir(directory) == []  # neither has a name yet
        first.take_name()
        assert fs.listdir(directory) == [segment_file_name(0)]
        # The writer makes the second itself (as after a slow allocator) and writes records.
        own = MappedFile(fs, second, SIZE)
        own._region.buf[:7] = b"records"  # type: ignore[union-attr]  # noqa: SLF001
        own._region.flush()  # type: ignore[union-attr]  # noqa: SLF001
        allocator.release()  # before: deleted `second` by its name, records and all
        assert fs.listdir(directory) == [segment_file_name(0), segment_file_name(SIZE)]
        assert fs.read_at(second, 0, 7) == b"records"


@pytest.mark.parametrize("kind", ["real", "simulated"])
def test_a_file_made_ahead_whose_name_is_taken_is_not_named_and_changes_nothing(tmp_path: Path, kind: str) -> None:
    fs, directory = _fs(kind, tmp_path)
    with helpers.open_small(tmp_path / "store") as store:
        allocator = _allocator(store, fs)
        made_ahead = _request(allocator, directory, 0)
        path = os.path.join(directory, segment_file_name(0))
        own = MappedFile(fs, path, SIZE)  # the writer's own file of that name, first
        own._region.buf[:4] = b"mine"  # type: ignore[union-attr]  # noqa: SLF001
        made_ahead._region.buf[:6] = b"theirs"  # type: ignore[union-attr]  # noqa: SLF001
        with pytest.raises(FileExistsError):
            made_ahead.take_name()
        assert not made_ahead.named
        assert made_ahead.destroy(0, 0)  # gives the map back only
        assert fs.listdir(directory) == [segment_file_name(0)]
        assert own._region.buf[:4] == b"mine"  # type: ignore[union-attr]  # noqa: SLF001
        allocator.release()
        assert fs.listdir(directory) == [segment_file_name(0)]


def test_a_writer_that_made_segments_itself_while_the_allocator_was_held_loses_nothing(store_dir: Path) -> None:
    """The allocator held in a file creation (a stalled disk, a pause) past the writer's wait:
    the writer makes the next segments itself; the allocator's late files, handed to a writer
    that no longer waits, are never named, and its release at the close deletes nothing."""
    hold = HoldAt("allocator.mid_allocation", hold_s=60)
    acknowledged: list[bytes] = []
    with helpers.open_small(store_dir, faults=hold, allocate_wait_timeout_ms=100) as store:
        hold.armed.set()
        i = 0
        while not hold.entered.is_set() or len(acknowledged) < 400:  # a few segments past the hold
            body = b"%06d" % i + b"x" * 900
            assert store.put(Message(topic="t", body=body)).ok
            acknowledged.append(body)
            i += 1
        segments = sorted(os.listdir(store_dir / "commitlog"))
        assert len(segments) >= 5
        hold.release.set()  # the allocator finishes the file it was making, for nobody
        for _ in range(200):  # and goes on making files ahead, named when taken
            body = b"%06d" % i + b"x" * 900
            assert store.put(Message(topic="t", body=body)).ok
            acknowledged.append(body)
            i += 1
    with mqstore.open(store_dir, **helpers.SMALL) as reopened:
        got: list[bytes] = []
        while len(got) < len(acknowledged) + 1:
            result = reopened.get("t", 0, len(got), 64)
            if not result.messages:
                break
            got.extend(bytes(m.body) for m in result.messages)
        assert got == acknowledged


def test_where_files_cannot_be_made_unnamed_the_writer_makes_each_segment_itself(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No O_TMPFILE (an old kernel, some FUSE and network filesystems) or no /proc: nothing is
    made ahead (the exposure above is not taken back for speed); said once per allocator."""
    caplog.set_level(logging.WARNING, logger="mqstore")
    tried: list[str] = []

    def unsupported(_fs: RealFileSystem, path: str, _size: int) -> None:
        tried.append(path)
        raise OSError(errno.EOPNOTSUPP, "Operation not supported", path)

    monkeypatch.setattr(RealFileSystem, "map_unnamed", unsupported)
    with helpers.open_small(store_dir) as store:
        for i in range(300):
            assert store.put(Message(topic="t", body=b"%06d" % i + b"x" * 900)).ok
        assert len(os.listdir(store_dir / "commitlog")) >= 4
        assert store.max_offset("t", 0) == 300
    assert len(tried) == 1  # the first try says so; later requests are answered at once
    said = [r for r in caplog.records if "no unnamed files" in r.getMessage()]
    assert len(said) == 1


def test_a_name_whose_directory_sync_failed_is_taken_back_and_made_again_synced(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 80 F1: the link of a made-ahead segment succeeded, the directory's fsync failed
    (EIO, reported once): the writer's fallback then opened the linked name and never synced
    the directory, while puts into the segment were acknowledged (a power loss could take the
    whole segment). The name is taken back now, and the fallback's own create syncs it."""
    real_fsync = os.fsync
    failed: list[int] = []
    synced_after: list[int] = []

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode) and os.readlink(f"/proc/self/fd/{fd}").endswith("/commitlog"):
            if armed and not failed:
                failed.append(fd)
                raise OSError(errno.EIO, "Input/output error")
            if failed:
                synced_after.append(fd)
        real_fsync(fd)

    armed = False
    monkeypatch.setattr(os, "fsync", fsync)
    with helpers.open_small(store_dir) as store:
        assert store.put(Message(topic="t", body=b"first")).ok
        armed = True
        i = 0
        while not failed:  # until the roll-over's naming met the failure
            assert store.put(Message(topic="t", body=b"%06d" % i + b"x" * 900)).ok
            i += 1
            assert i < 1000, "no roll-over named a segment"
        result = store.put(Message(topic="t", body=b"in the new segment"))
        assert result.ok and result.commitlog_offset >= SIZE
        assert synced_after, "the segment's name was never made durable"
