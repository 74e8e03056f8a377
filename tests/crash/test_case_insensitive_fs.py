"""A store on a filesystem that does not tell upper and lower case apart (vfat, exFAT, SMB
shares, WSL's /mnt/c, macOS's default APFS, ext4 with `chattr +F`), and that refuses the
characters Windows reserves (vfat and NTFS refuse the `|` RocketMQ allows in topics).

Topic names become directory names. Before, on such a filesystem:
- "orders" after "Orders" was PUT_OK: both topics' queues opened consumequeue/Orders/0/, each
  writing units over the other's; neither was readable, and the next open failed (recovery
  rebuilt "orders" by cutting the files they shared);
- "a|b" was PUT_OK, then its directory could not be made: dispatch held every later put of
  every topic (not readable until the store was moved).
Now a topic new to the store gets its directory before its first put is taken: the put is
refused (MESSAGE_ILLEGAL, naming the directory found or the errno) and nothing else changes.
A log that already holds two such topics (written on another filesystem) dispatches the one
whose directory it is and waits, loudly, at the other: never one's units in the other's files.

The filesystem is `casefold_fs.py` (FUSE, a passthrough over a directory of tmp_path). Needs
root, /dev/fuse, libfuse 3 (`fusermount3`) and the `mfusepy` package; skips with the reason
when one is missing (.ci/bootstrap installs them as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import mqstore
from mqstore import Message, supervisor
from mqstore.storage.codec import CQ_UNIT
from mqstore.storage.status import GetMessageStatus, PutMessageStatus

FS = str(Path(__file__).with_name("casefold_fs.py"))
SETTINGS = dict(
    read_your_writes_timeout_ms=1000,
    mapped_file_size_commitlog_bytes=256 * 1024,  # small files: every write goes through the FUSE daemon
    mapped_file_size_consume_queue_bytes=20 * 1000,
    max_hash_slot_num=64,
    max_index_num=400,
)


def _mount_or_skip(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a FUSE filesystem needs root here")
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("no /dev/fuse or no fusermount3 (libfuse 3)")
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        pytest.skip(f"mfusepy cannot be loaded: {exc}")
    backing, mount_point = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mount_point.mkdir()
    child = subprocess.Popen([sys.executable, FS, str(backing), str(mount_point)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mount_point):
            if child.poll() is not None or time.monotonic() > deadline:
                child.kill()
                pytest.skip(f"the FUSE filesystem did not mount: {child.communicate()[1].decode()[-300:]}")
            time.sleep(0.05)
        (mount_point / "Probe").mkdir()
        assert (mount_point / "probe").is_dir(), "the test filesystem does not fold case"
        (mount_point / "Probe").rmdir()
        yield mount_point
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mount_point)], capture_output=True)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()


@pytest.fixture
def casefold_dir(tmp_path: Path) -> Iterator[Path]:
    yield from _mount_or_skip(tmp_path)


def _bodies(store: mqstore.MessageStore, topic: str) -> list[bytes]:
    got = store.get(topic, 0, 0, 64)
    return [m.body for m in got.messages]


def test_a_topic_that_finds_another_topics_directory_is_refused_and_the_other_keeps_every_message(
    casefold_dir: Path,
) -> None:
    path = casefold_dir / "store"
    with mqstore.open(path, **SETTINGS) as store:
        for i in range(5):
            first = store.put(Message(topic="Orders", body=b"Orders-%d" % i))
            assert first.status is PutMessageStatus.PUT_OK
            second = store.put(Message(topic="orders", body=b"orders-%d" % i))
            assert second.status is PutMessageStatus.MESSAGE_ILLEGAL, second
            assert "'Orders'" in second.detail and "case" in second.detail
        assert _bodies(store, "Orders") == [b"Orders-%d" % i for i in range(5)]
        assert store.get("orders", 0, 0, 64).status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
    assert sorted(os.listdir(path / "consumequeue")) == ["Orders"]
    with mqstore.open(path, **SETTINGS) as store:  # opens again, every message there
        assert _bodies(store, "Orders") == [b"Orders-%d" % i for i in range(5)]
        assert store.put(Message(topic="ORDERS", body=b"x")).status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.put(Message(topic="Orders", body=b"Orders-5")).status is PutMessageStatus.PUT_OK
        assert _bodies(store, "Orders")[-1] == b"Orders-5"


def test_a_topic_name_the_filesystem_refuses_is_refused_and_dispatch_goes_on(casefold_dir: Path) -> None:
    with mqstore.open(casefold_dir / "store", **SETTINGS) as store:
        refused = store.put(Message(topic="a|b", body=b"pipe"))
        assert refused.status is PutMessageStatus.MESSAGE_ILLEGAL, refused
        assert "Invalid argument" in refused.detail
        later = store.put(Message(topic="after", body=b"later"))
        assert later.status is PutMessageStatus.PUT_OK
        assert _bodies(store, "after") == [b"later"]  # before: dispatch held behind "a|b"
        async_refused = store.put_async(Message(topic="a|b", body=b"again")).result(timeout=30)
        assert async_refused.status is PutMessageStatus.MESSAGE_ILLEGAL


def _units(queue_dir: Path) -> list[tuple[int, int, int]]:
    units = []
    for name in sorted(os.listdir(queue_dir)):
        data = (queue_dir / name).read_bytes()
        for offset, size, tags in CQ_UNIT.iter_unpack(data[: len(data) - len(data) % CQ_UNIT.size]):
            if size <= 0:
                break
            units.append((offset, size, tags))
    return units


def test_a_log_holding_two_topics_of_one_directory_never_mixes_their_units(
    tmp_path: Path, casefold_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written on a case-sensitive filesystem, its log and checkpoint copied to a
    case-insensitive one: re-dispatch writes "Orders"'s units and waits at the first record
    of "orders", whose directory would be the same."""
    monkeypatch.setattr(supervisor, "DISPATCH_CATCH_UP_TIMEOUT_MS", 500)  # the open and close wait this long
    written = tmp_path / "written"
    orders_positions = set()
    with mqstore.open(written, **SETTINGS) as store:
        for i in range(5):
            assert store.put(Message(topic="Orders", body=b"Orders-%d" % i)).status is PutMessageStatus.PUT_OK
            put = store.put(Message(topic="orders", body=b"orders-%d" % i))
            orders_positions.add(put.commitlog_offset)
    moved = casefold_dir / "store"
    moved.mkdir()
    for name in os.listdir(written):
        if name in ("consumequeue", "index", "lock"):
            continue
        source = written / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, moved / name)
    with mqstore.open(moved, **SETTINGS) as store:
        first = store.get("Orders", 0, 0, 64)
        assert [m.body for m in first.messages] in ([], [b"Orders-0"])  # dispatch waits at "orders-0"
        held = store.get("orders", 0, 0, 64)
        assert held.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        assert held.next_begin_offset == 0
    assert os.listdir(moved / "consumequeue") == ["Orders"]
    units = _units(moved / "consumequeue" / "Orders" / "0")
    assert units and not orders_positions & {offset for offset, _, _ in units}


def test_a_topic_cleaned_away_and_taken_by_a_case_variant_is_claimed_again(casefold_dir: Path) -> None:
    """Review 72 H1: clean_unused_topic removed "Orders"'s directory and the ConsumeQueue actor
    forgot its claim, but the put encoder did not: after "orders" took the freed name, a put
    of "Orders" was PUT_OK and its record held dispatch for every topic, also after a reopen."""
    with mqstore.open(casefold_dir / "store", **SETTINGS) as store:
        assert store.put(Message(topic="Orders", body=b"old")).ok
        assert _bodies(store, "Orders") == [b"old"]
        assert store.clean_unused_topic(keep=[]) == 1
        assert store.put(Message(topic="orders", body=b"new")).ok
        refused = store.put(Message(topic="Orders", body=b"again"))
        assert refused.status is PutMessageStatus.MESSAGE_ILLEGAL and "'orders'" in refused.detail, refused
        assert store.put(Message(topic="unrelated", body=b"u")).ok
        assert _bodies(store, "unrelated") == [b"u"] and _bodies(store, "orders") == [b"new"]
