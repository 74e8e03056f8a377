"""A store that fills a real small filesystem (a tmpfs, and a loop-mounted ext4 image) never
dies with SIGBUS, loses nothing it acknowledged, opens again while the disk is full, and
takes puts again once space is freed, without a restart (issue 19, item 1).

Each phase runs the store in a child process (small_fs_child.py), so a SIGBUS shows as the
child's death by that signal instead of killing the test runner. Needs root (mount); skips
with the reason when the filesystem cannot be mounted.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

CHILD = str(Path(__file__).with_name("small_fs_child.py"))
PHASES = ("fill", "reopen_full", "free", "verify")
PHASE_TIMEOUT_S = 180  # (a reopen on a full tmpfs outlasted 60 s once on a loaded CI machine)


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _mount_or_skip(cmd: list[str], mount_point: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    result = _run(cmd + [str(mount_point)])
    if result.returncode != 0:
        pytest.skip(f"cannot mount ({' '.join(cmd)}): {result.stderr.strip()}")


@contextlib.contextmanager
def _tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    _mount_or_skip(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs"], mount_point)
    try:
        yield mount_point
    finally:
        _run(["umount", "-l", str(mount_point)])


@contextlib.contextmanager
def _ext4(tmp_path: Path, size_mib: int = 16) -> Iterator[Path]:
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed")
    image = tmp_path / "ext4.img"
    with open(image, "wb") as f:
        f.truncate(size_mib * 1024 * 1024)
    made = _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", str(image)])
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
    mount_point = tmp_path / "ext4"
    mount_point.mkdir()
    _mount_or_skip(["mount", "-o", "loop", str(image)], mount_point)
    try:
        yield mount_point
    finally:
        _run(["umount", "-l", str(mount_point)])


@pytest.mark.parametrize("filesystem", [_tmpfs, _ext4], ids=["tmpfs", "ext4"])
def test_a_store_filling_a_small_filesystem_never_dies_and_loses_nothing(tmp_path: Path, filesystem: object) -> None:
    acked = tmp_path / "acked.txt"  # outside the small filesystem: it must never be refused
    acked.write_text("")
    with filesystem(tmp_path) as mount_point:  # type: ignore[operator]
        store_dir = str(mount_point / "store")
        filler = str(mount_point / "filler")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
        for phase in PHASES:
            child = subprocess.run(
                [sys.executable, "-X", "faulthandler", CHILD, phase, store_dir, str(acked), filler],
                capture_output=True, text=True, timeout=PHASE_TIMEOUT_S, env=env,
            )  # fmt: skip
            died = f"phase {phase}: exit {child.returncode}\n{child.stdout[-2000:]}\n{child.stderr[-3000:]}"
            assert child.returncode != -signal.SIGBUS, "SIGBUS: " + died
            assert child.returncode == 0, died
        keys = acked.read_text().split()
        assert any(k.startswith("a") for k in keys) and any(k.startswith("b") for k in keys)


RECOVER_ON_FULL_TMPFS = """
import sys
from mqstore.storage.consume_queue import ConsumeQueue
from mqstore.storage.fs import RealFileSystem

root, fill = sys.argv[1], sys.argv[2]
fs = RealFileSystem()
cq = ConsumeQueue(fs, "T", 0, root, mapped_file_size=300_000 * 20, clock_ms=lambda: 0)
cq.load()
for q in range(100):
    assert cq.put_message_position_info(q * 100, 100, 0, q)
cq.mapped_file_queue.shutdown(0)
with open(fill, "wb", buffering=0) as f:  # the tmpfs full to its last page
    try:
        while True:
            f.write(bytes(4096))
    except OSError:
        pass
cq = ConsumeQueue(fs, "T", 0, root, mapped_file_size=300_000 * 20, clock_ms=lambda: 0)
cq.load()
cq.recover()  # scans the 6 MB file: its unwritten tail is a hole
assert cq.get_max_offset_in_queue() == 100, cq.get_max_offset_in_queue()
assert cq.get_last_offset() == 99 * 100 + 100
print("recovered")
"""


def test_consume_queue_recovery_on_a_full_tmpfs_reads_no_hole(tmp_path: Path) -> None:
    """A read through a map of a tmpfs hole must allocate a page; on a full tmpfs it cannot,
    and the process dies with SIGBUS. Recovery scans a ConsumeQueue file whose tail was
    never written: it must read only where the file has data."""
    with _tmpfs(tmp_path) as mount_point:
        child = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", RECOVER_ON_FULL_TMPFS,
             str(mount_point / "consumequeue"), str(mount_point / "filler")],
            capture_output=True, text=True, timeout=PHASE_TIMEOUT_S,
        )  # fmt: skip
        assert child.returncode != -signal.SIGBUS, "SIGBUS:\n" + child.stderr[-3000:]
        assert child.returncode == 0 and "recovered" in child.stdout, child.stderr[-3000:]


NEW_STORE_ON_FULL_FILESYSTEM = """
import os, sys
import mqstore

root, filler, free_pages = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = dict(mapped_file_size_commitlog_bytes=1024 * 1024, mapped_file_size_consume_queue_bytes=20 * 2000,
                max_hash_slot_num=1000, max_index_num=4000, disk_space_warning_level_ratio=1.0,
                disk_space_clean_forcibly_ratio=1.0, clean_file_forcibly_enable=False)
with open(filler, "wb", buffering=0) as f:  # the filesystem full to its last page...
    try:
        while True:
            f.write(bytes(4096))
    except OSError:
        pass
    os.fsync(f.fileno())
    f.truncate(max(f.tell() - free_pages * 4096, 0))  # ...but `free_pages`
try:
    store = mqstore.open(root, **settings)
except mqstore.StoreDiskFullError as exc:
    print("refused:", exc)
    left = sorted(os.listdir(root)) if os.path.isdir(root) else []
    assert not {"abort", "abort.tmp", "checkpoint"} & set(left), left
else:
    result = store.put(mqstore.Message(topic="T", body=b"m", keys=["full"]))
    assert result.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE and "disk full" in result.detail, result
    assert store.supervisor.state.name == "RUNNING" and store.supervisor.restarts == [], store.supervisor.restarts
    os.remove(filler)
    assert store.put(mqstore.Message(topic="T", body=b"m", keys=["k0"])).ok
    assert store.close()
    print("opened and refused puts until space was freed")
if os.path.exists(filler):
    os.remove(filler)
    with mqstore.open(root, **settings) as store:  # nothing left held or half-made
        assert store.supervisor.recovery.last_exit_ok
        assert store.put(mqstore.Message(topic="T", body=b"m", keys=["k0"])).ok
with mqstore.open(root, **settings) as store:
    got = store.get("T", 0, 0, 10)
    assert [m.key_list for m in got.messages] == [["k0"]], got
print("ok")
"""


@pytest.mark.parametrize(
    ("free_pages", "outcome"),
    [(0, "refused: disk full: no space for the store's lock file"),
     (1, "refused: disk full: no space for the store's checkpoint"),
     (16, "opened and refused puts until space was freed")],
    ids=["no-page", "one-page", "room-for-the-checkpoint-only"],
)  # fmt: skip
@pytest.mark.parametrize("filesystem", [_tmpfs, _ext4], ids=["tmpfs", "ext4"])
def test_a_new_store_on_a_full_filesystem_is_refused_or_refuses_puts_in_order(
    tmp_path: Path, free_pages: int, outcome: str, filesystem: object
) -> None:
    """A new store opened on a full filesystem: with no room for its lock or checkpoint the open
    refuses with StoreDiskFullError naming the file and leaves no abort marker or checkpoint
    behind; with room for those but not for the first commitlog blocks it opens, refuses
    puts as a full disk, and takes them once space is freed. Either way the same store opens
    and works once space is back, and nothing dies with SIGBUS."""
    with filesystem(tmp_path) as mount_point:  # type: ignore[operator]
        child = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", NEW_STORE_ON_FULL_FILESYSTEM,
             str(mount_point / "store"), str(mount_point / "filler"), str(free_pages)],
            capture_output=True, text=True, timeout=PHASE_TIMEOUT_S,
            env={k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")},
        )  # fmt: skip
        assert child.returncode != -signal.SIGBUS, "SIGBUS:\n" + child.stderr[-3000:]
        assert child.returncode == 0 and child.stdout.endswith("ok\n"), child.stdout + child.stderr[-3000:]
        # Which file finds the disk full first depends on the filesystem (on ext4 the store's
        # directories take blocks too): the exact file is asserted on tmpfs.
        assert (outcome if filesystem is _tmpfs else outcome.split(":")[0]) in child.stdout, child.stdout
        if outcome.startswith("refused"):
            assert "disk full: no space for " in child.stdout, child.stdout
            assert str(mount_point / "store") in child.stdout, child.stdout  # the error names the file


FOREIGN_FILL_CHILD = str(Path(__file__).with_name("foreign_fill_child.py"))


@pytest.mark.parametrize(
    ("filesystem", "puts_before_fill", "reopen"),
    [(_tmpfs, 300, False),
     # 24 and 32 MiB images died with SIGBUS on every run until reserved pages were
     # initialised with pwrite (fs.RealMappedRegion._initialise); 16 MiB survived anyway.
     (functools.partial(_ext4, size_mib=32), 300, False),
     (functools.partial(_ext4, size_mib=24), 300, False),
     # The fill lands later in the segment's reservation, and after a reopen (recovery read
     # the tail pages before the appends into them).
     (functools.partial(_ext4, size_mib=32), 5000, False),
     (functools.partial(_ext4, size_mib=32), 300, True)],
    ids=["tmpfs", "ext4-32M", "ext4-24M", "ext4-32M-late-fill", "ext4-32M-reopened"],
)  # fmt: skip
def test_a_filesystem_filled_to_its_last_block_by_another_writer_never_kills_the_store(
    tmp_path: Path, filesystem: object, puts_before_fill: int, reopen: bool
) -> None:
    """The store did not fill the disk: another process did, to its last byte, while the store
    ran (a log file gone wild). Puts are refused as a full disk, nothing dies with SIGBUS, puts
    succeed again once the other file is gone, and every acknowledged message is readable."""
    with filesystem(tmp_path) as mount_point:  # type: ignore[operator]
        child = subprocess.run(
            [sys.executable, "-X", "faulthandler", FOREIGN_FILL_CHILD, str(mount_point), str(puts_before_fill)]
            + (["reopen"] if reopen else []),
            capture_output=True, text=True, timeout=PHASE_TIMEOUT_S,
            env={k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")},
        )  # fmt: skip
        assert child.returncode != -signal.SIGBUS, "SIGBUS:\n" + child.stderr[-3000:]
        assert child.returncode == 0 and " lost 0 " in child.stdout, child.stdout + child.stderr[-3000:]


FILL_THEN_KILL = """
import os, signal, sys
import mqstore

root, filler, segment = sys.argv[1], sys.argv[2], int(sys.argv[3])
# (No index: recovery's reads of the log are under test; an index re-dispatch could not write
# on the full disk, and the open would wait for it 5-10 s.)
store = mqstore.open(root, mapped_file_size_commitlog_bytes=segment, message_index_enable=False)
# 512-byte bodies: the log fills the disk with at most ~4,300 records, whose queue units stay
# well inside the blocks the queue's file took ahead (256 KiB, ~13,000 units) at its first
# units. With 128-byte bodies ~12,000 acknowledged units came near them, and those past them
# could not be written on the full disk: the reopen waited for room before serving them.
for i in range(200):
    assert store.put(mqstore.Message(topic="T", body=b"%08d" % i * 64)).ok
# Filled before the first units are dispatched (a loaded machine), the queue's file would get
# only the blocks left, and its later units could not be written.
assert store.wait_for_messages("T", 0, 199, 60)
with open(filler, "wb", buffering=0) as f:  # another program fills the disk while the store puts
    for size in (1 << 16, 4096, 512, 1):
        try:
            while True:
                f.write(b"\\1" * size)
        except OSError:
            pass
acked, refused, i = 200, 0, 200
while refused < 50:
    result = store.put(mqstore.Message(topic="T", body=b"%08d" % i * 64))
    i += 1
    acked, refused = (acked + 1, refused) if result.ok else (acked, refused + 1)
print(acked, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

REOPEN_ON_THE_FULL_DISK = """
import sys
import mqstore

import os
import time
root, segment, acked, filler = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = mqstore.open(root, mapped_file_size_commitlog_bytes=segment, message_index_enable=False)

def wait_known(seconds):
    deadline = time.monotonic() + seconds
    while store.max_offset("T", 0) == -1 and time.monotonic() < deadline:
        time.sleep(0.1)  # -1: not known yet (re-dispatch behind the read-your-writes wait under load)

wait_known(30)
freed = store.max_offset("T", 0) == -1
if freed:
    # The queue's units past the blocks its file had reserved wait for room (README, "A full
    # disk never grows memory"): 1 CI run in ~9 met it. Nothing is lost: room brings them.
    os.remove(filler)
    wait_known(120)
assert store.max_offset("T", 0) == acked, (store.max_offset("T", 0), acked, freed)
offset = 0
while offset < acked:
    got = store.get("T", 0, offset, 32)
    assert got.found and [m.body[:8] for m in got.messages] == [b"%08d" % n for n in range(offset, got.next_begin_offset)], got.status
    offset = got.next_begin_offset
if not freed:
    assert not store.put(mqstore.Message(topic="T", body=b"more")).ok  # the disk is still full
store.close()
print("served", offset, "after freeing room" if freed else "on the full disk")
"""


@pytest.mark.parametrize("segment", [1 << 20, 4 << 20], ids=["next-segment-unreserved", "segment-tail-unreserved"])
def test_a_store_that_filled_a_tmpfs_opens_again_while_it_is_still_full(tmp_path: Path, segment: int) -> None:
    """Review 116 F1: killed after filling a tmpfs, the store did not open until much more than
    its data's room was freed (UnreadDuringRecoveryError, EIO): recovery read the holes past
    its data, the first page of a segment it could reserve no block for and a magic checked
    across a data extent's end, and a read of a tmpfs hole needs a page there is no room for.
    It opens and refuses puts on the full disk, and serves every acknowledged message: there,
    or (the queue's units past its reserved blocks waiting for room) once room is freed."""
    with _tmpfs(tmp_path) as mount_point:
        root, filler = mount_point / "store", mount_point / "filler"
        fill = subprocess.run([sys.executable, "-c", FILL_THEN_KILL, str(root), str(filler), str(segment)],
                              capture_output=True, text=True, timeout=PHASE_TIMEOUT_S)  # fmt: skip
        assert fill.returncode == -signal.SIGKILL, fill.stderr[-3000:]
        acked = int(fill.stdout.split()[0])
        reopen = subprocess.run([sys.executable, "-X", "faulthandler", "-c", REOPEN_ON_THE_FULL_DISK, str(root),
                                 str(segment), str(acked), str(filler)], capture_output=True, text=True,
                                timeout=PHASE_TIMEOUT_S)  # fmt: skip
        assert reopen.returncode == 0 and f"served {acked} " in reopen.stdout, reopen.stderr[-3000:]


@pytest.mark.parametrize("damaged", [2, 4], ids=["records-between", "the-next-record-spans-holes"])
def test_a_record_spanning_a_hole_of_a_sparse_copy_is_found_past_damage(tmp_path: Path, damaged: int) -> None:
    """The look past damage reads no magic in a hole (review 116 F1), but a record it finds is
    read whole: one whose body holds whole pages of zeros spans holes once the segment is
    copied sparse (`cp --sparse=always`), and is a message, not more damage."""
    import mqstore

    root = tmp_path / "store"
    with mqstore.open(root, mapped_file_size_commitlog_bytes=1 << 20) as store:
        at = [store.put(mqstore.Message(topic="T", body=b"%04d" % i + b"x" * 300)).commitlog_offset for i in range(5)]
        zeros = store.put(mqstore.Message(topic="T", body=bytes(64 * 1024)))
        last = store.put(mqstore.Message(topic="T", body=b"last"))
        assert zeros.ok and last.ok
    segment = root / "commitlog" / "00000000000000000000"
    with open(segment, "r+b") as f:  # one flipped body byte: that record is damage, records follow it
        f.seek(at[damaged] + 200)
        byte = f.read(1)
        f.seek(at[damaged] + 200)
        f.write(bytes([byte[0] ^ 0xFF]))
    sparse = tmp_path / "sparse"
    subprocess.run(["cp", "--sparse=always", str(segment), str(sparse)], check=True)
    os.replace(sparse, segment)
    (root / "abort").write_bytes(b"")  # a crash: recovery looks past the damage
    with mqstore.open(root, mapped_file_size_commitlog_bytes=1 << 20) as store:
        got = store.get("T", 0, 5, 32)
        assert [m.queue_offset for m in got.messages] == [5, 6], got.status
        assert got.messages[0].body == bytes(64 * 1024) and got.messages[1].body == b"last"
