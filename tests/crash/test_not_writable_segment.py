"""The active commitlog segment made not writable under a running store (review 65 F3):
`chattr +i` makes ext4 refuse the writer's page fault with SIGBUS, which the map guard turns
into a refused put. The cause must be named as what it is (not "cut short by another
process"), the store must stay up serving reads (it stopped for good: every restart failed to
load the segment with EPERM until the supervisor gave up), and puts must resume by themselves
once the segment is writable again. Needs root (CAP_LINUX_IMMUTABLE) and a filesystem with
attributes: tmp_path if it has them, else a loop-mounted ext4 image; skips with the reason."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import time
from pathlib import Path
from typing import Iterator

import pytest

import mqstore
from mqstore.messages import Ping
from mqstore import Message, PutMessageStatus
from mqstore.storage import mapguard
from mqstore.storage.fs import FS_IMMUTABLE_FL

from .test_small_filesystem import _ext4

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built (no C compiler)")

_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
SETTINGS = dict(mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=20 * 50,
                max_hash_slot_num=64, max_index_num=200, read_your_writes_timeout_ms=1000)  # fmt: skip


def _set_immutable(path: str, on: bool) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = struct.unpack("=i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 4))[0]
        flags = flags | FS_IMMUTABLE_FL if on else flags & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("=i", flags))
    finally:
        os.close(fd)


def _can_set_immutable(directory: Path) -> str | None:
    """None if a file in `directory` takes chattr +i here, else why not."""
    probe = directory / "probe"
    probe.write_bytes(b"x")
    try:
        _set_immutable(str(probe), True)
    except OSError as exc:
        return f"chattr +i refused in {directory}: {exc}"
    finally:
        with contextlib.suppress(OSError):
            _set_immutable(str(probe), False)
        probe.unlink()
    return None


@contextlib.contextmanager
def _attribute_dir(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("chattr +i needs root (CAP_LINUX_IMMUTABLE)")
    if _can_set_immutable(tmp_path) is None:
        yield tmp_path
        return
    with _ext4(tmp_path, 32) as mount_point:  # tmpfs has no attributes: a small ext4 image
        why = _can_set_immutable(mount_point)
        if why is not None:
            pytest.skip(why)
        yield mount_point


class _Immutable:
    """The files a test made immutable, so that whatever happens they are made writable again
    (a file left +i cannot be deleted, even by root)."""

    def __init__(self) -> None:
        self.paths: set[str] = set()

    def set(self, path: str, on: bool) -> None:
        _set_immutable(path, on)
        (self.paths.add if on else self.paths.discard)(path)

    def clear(self) -> None:
        for path in sorted(self.paths):
            _set_immutable(path, False)
        self.paths.clear()


@contextlib.contextmanager
def _running_store(root: Path) -> Iterator[tuple[str, mqstore.Store, _Immutable]]:
    """(the store's path, the store open there, the immutable files): on the way out the files
    are made writable again and the store is closed."""
    path = str(root / "store")
    store = mqstore.open_store(path, **SETTINGS)
    flags = _Immutable()
    try:
        yield path, store, flags
    finally:
        flags.clear()
        store.close()


def _put(store: mqstore.Store, i: int) -> mqstore.PutResult:
    return store.put(Message(topic="T", body=b"x" * 200 + str(i).encode(), keys=[f"k{i}"]))


def _bodies(store: mqstore.MessageStore) -> list[bytes]:
    got = store.get("T", 0, 0, 1000)
    assert got.status.name == "FOUND", got
    return [m.body for m in got.messages]


def test_an_immutable_active_segment_refuses_puts_by_its_cause_keeps_reads_and_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="mqstore")
    with _attribute_dir(tmp_path) as root:
        with _running_store(root) as (path, store, flags):
            segment = os.path.join(path, "commitlog", "00000000000000000000")
            assert all(_put(store, i).status is PutMessageStatus.PUT_OK for i in range(10))
            flags.set(segment, True)
            first = _put(store, 10)  # faults on its page: the guard, then the writer fails once
            assert first.status is not PutMessageStatus.PUT_OK
            assert "not writable" in first.detail and "cut short" not in first.detail, first.detail
            # The restarted writer runs degraded: puts refused by their cause, reads served,
            # and the store does not stop (the restarts had used the budget up in ~5 s).
            deadline = time.monotonic() + 5
            refused = _put(store, 11)
            while "not writable" not in refused.detail and time.monotonic() < deadline:
                time.sleep(0.1)  # the one restart: "writer is restarting" meanwhile
                refused = _put(store, 11)
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
                assert "not writable" in refused.detail and "Operation not permitted" in refused.detail, refused.detail
                time.sleep(0.5)
                refused = _put(store, 11)
            assert _bodies(store) == [b"x" * 200 + str(i).encode() for i in range(10)]
            assert store.max_offset("T", 0) == 10
            assert store.running and len(store.supervisor.restarts) == 1  # one restart, not the budget
            said = [r.getMessage() for r in caplog.records]
            assert not any("cut short" in line for line in said), said
            assert any("not writable" in line for line in said), said
            flags.set(segment, False)
            deadline = time.monotonic() + 10
            resumed = _put(store, 12)
            while resumed.status is not PutMessageStatus.PUT_OK and time.monotonic() < deadline:
                time.sleep(0.2)
                resumed = _put(store, 12)
            # The refused record's bytes are not taken for where the log was read (review 65 F3:
            # "the commitlog ends at 6020, below 6321 ... a segment was replaced").
            assert resumed.status is PutMessageStatus.PUT_OK, resumed
            assert resumed.queue_offset == 10
            store.wait_for_messages("T", 0, 11, timeout_s=5)
            assert _bodies(store)[-1] == b"x" * 200 + b"12"
        reopened = mqstore.open_store(path, **SETTINGS)
        try:
            assert _bodies(reopened) == [b"x" * 200 + str(i).encode() for i in [*range(10), 12]]
        finally:
            reopened.close()


def test_a_segment_replaced_while_not_writable_is_a_replacement_not_taken_over(tmp_path: Path) -> None:
    """Review 66 F1: while the writer waited for its segment to be writable again, an older
    copy renamed over it (a restore) was mapped as the segment made writable, positions and
    all: the acknowledged records it lacked were gone, no copy was saved, and the next put
    was acknowledged. It is a replacement: the store's copy is saved and puts are refused."""
    with _attribute_dir(tmp_path) as root, _running_store(root) as (path, store, flags):
        segment = os.path.join(path, "commitlog", "00000000000000000000")
        assert all(_put(store, i).status is PutMessageStatus.PUT_OK for i in range(5))
        store.flush()
        older = Path(segment).read_bytes()  # a backup holding 5 records
        assert all(_put(store, i).status is PutMessageStatus.PUT_OK for i in range(5, 10))
        flags.set(segment, True)
        assert _put(store, 10).status is not PutMessageStatus.PUT_OK
        deadline = time.monotonic() + 5
        while "not writable" not in _put(store, 11).detail and time.monotonic() < deadline:
            time.sleep(0.1)  # the one restart, then the degraded writer
        Path(segment + ".restore").write_bytes(older)
        flags.set(segment, False)
        os.rename(segment + ".restore", segment)
        deadline = time.monotonic() + 5
        refused = _put(store, 12)
        while "not writable" in refused.detail and time.monotonic() < deadline:
            time.sleep(0.2)
            refused = _put(store, 12)
        assert refused.status is not PutMessageStatus.PUT_OK, refused
        assert "replaced" in refused.detail, refused.detail
        copies = [n for n in os.listdir(os.path.join(path, "commitlog")) if n.startswith("00000000000000000000.")]
        assert copies, os.listdir(os.path.join(path, "commitlog"))
        kept = Path(path, "commitlog", copies[0]).read_bytes()
        assert all(b"x" * 200 + str(i).encode() in kept for i in range(10))


def test_a_segment_made_ahead_that_is_not_writable_is_named_so_not_disk_full(tmp_path: Path) -> None:
    """Review 66 F2: chattr +i on the segment the allocator made ahead refused every put past
    the roll as "disk full" (its blocks could not be reserved: EPERM)."""
    with _attribute_dir(tmp_path) as root, _running_store(root) as (path, store, flags):
        ahead = os.path.join(path, "commitlog", "%020d" % (64 * 1024))
        i = 0
        deadline = time.monotonic() + 10
        while not os.path.exists(ahead) and time.monotonic() < deadline:
            assert _put(store, i).status is PutMessageStatus.PUT_OK
            i += 1
        # The file is there before the allocator has made it whole (its blocks reserved): made
        # immutable meanwhile, the allocation failed, the writer made the segment itself and
        # said "could not be created" (1 run in 5 in the pure-Python pass). The allocator
        # answers a Ping once that request is done.
        store.supervisor._ask("allocator", Ping())
        flags.set(ahead, True)
        refused = None
        for _ in range(400):  # past the roll onto the segment made ahead
            result = _put(store, i)
            if result.status is not PutMessageStatus.PUT_OK:
                refused = result
                break
            i += 1
        assert refused is not None and "not writable" in refused.detail and "disk full" not in refused.detail, refused
        flags.set(ahead, False)
        deadline = time.monotonic() + 10
        resumed = _put(store, i)
        while resumed.status is not PutMessageStatus.PUT_OK and time.monotonic() < deadline:
            time.sleep(0.2)
            resumed = _put(store, i)
        assert resumed.status is PutMessageStatus.PUT_OK, resumed
