"""A reading thread that cannot map a commitlog segment that is there (the process out of file
descriptors, memory or map count) gets "not now", never "removed" (review 52 H1): a get said
MESSAGE_WAS_REMOVING with next_begin_offset past every stored message, so a consumer following
RocketMQ's rules moved on and committed past messages it never saw; a query and a lookup said
"none". The same reads answer in full once the pressure is gone."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import GetMessageStatus, Message, MessageStore
from mqstore.storage.commitlog import CommitLogReader
from mqstore.storage.fs import RealFileSystem

SEGMENT = 256 * 1024
MESSAGES = 24


class Pressure:
    """Makes the calling thread's read-only commitlog maps (or its listing of the commitlog)
    fail with `err` while on, as a process out of descriptors (EMFILE) or memory (ENOMEM)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, what: str, err: int) -> None:
        self.on = threading.local()
        real_map, real_listdir = RealFileSystem.map_file, RealFileSystem.listdir

        def map_file(fs: RealFileSystem, path: str, size: int, *, create: bool = True, readonly: bool = False,
                     exclusive: bool = False) -> Any:
            if what == "map" and readonly and "/commitlog/" in path and getattr(self.on, "value", False):
                raise OSError(err, "injected", path)
            return real_map(fs, path, size, create=create, readonly=readonly, exclusive=exclusive)

        def listdir(fs: RealFileSystem, path: str) -> list[str]:
            if what == "list" and path.endswith("commitlog") and getattr(self.on, "value", False):
                raise OSError(err, "injected", path)
            return real_listdir(fs, path)

        monkeypatch.setattr(RealFileSystem, "map_file", map_file)
        monkeypatch.setattr(RealFileSystem, "listdir", listdir)

    def run(self, read: Callable[[], Any]) -> Any:
        self.on.value = True
        try:
            return read()
        finally:
            self.on.value = False


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[MessageStore, list[Any]]]:
    with mqstore.open(tmp_path / "s", mapped_file_size_commitlog_bytes=SEGMENT) as s:
        results = [s.put(Message("T", bytes([i]) * 30_000, queue_id=0, keys=[f"k{i}"])) for i in range(MESSAGES)]
        assert all(r.ok for r in results)
        assert s.wait_for_messages("T", 0, MESSAGES - 1, 10)
        yield s, results


def in_new_thread(read: Callable[[], Any]) -> Any:
    """`read` in a thread of its own: it maps the segments itself, on its first read."""
    answers: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            answers.append(read())
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if errors:
        raise errors[0]
    return answers[0]


@pytest.mark.parametrize(("what", "err"), [("map", errno.EMFILE), ("map", errno.ENOMEM), ("list", errno.EMFILE)])
def test_a_get_that_cannot_map_a_present_segment_keeps_the_consumers_offset(
    store: tuple[MessageStore, list[Any]], monkeypatch: pytest.MonkeyPatch, what: str, err: int
) -> None:
    s, _ = store
    pressure = Pressure(monkeypatch, what, err)

    def reads() -> tuple[Any, Any]:
        return pressure.run(lambda: s.get("T", 0, 3, 8)), s.get("T", 0, 3, 8)

    under, after = in_new_thread(reads)
    assert under.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE and not under.messages
    assert under.next_begin_offset == 3 and "could not be mapped now" in under.detail
    assert after.status is GetMessageStatus.FOUND  # the same thread, once it maps again
    assert [m.queue_offset for m in after.messages] == list(range(3, 3 + len(after.messages)))
    assert after.messages and after.messages[0].body == bytes([3]) * 30_000


def test_a_query_and_a_lookup_that_cannot_map_say_so_instead_of_none(
    store: tuple[MessageStore, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    s, results = store
    pressure = Pressure(monkeypatch, "map", errno.EMFILE)
    offset = results[5].commitlog_offset

    def reads() -> tuple[Any, ...]:
        found = pressure.run(lambda: s.query("T", "k5"))
        try:
            pressure.run(lambda: s.lookup(offset))
            lookup_error: OSError | None = None
        except OSError as exc:
            lookup_error = exc
        return found, lookup_error, s.query("T", "k5"), s.lookup(offset)

    found, lookup_error, found_after, record_after = in_new_thread(reads)
    assert not found.messages and "could not be mapped now" in found.detail, found
    assert lookup_error is not None and lookup_error.errno == errno.EMFILE
    assert "could not be mapped now" in str(lookup_error)
    assert [m.commitlog_offset for m in found_after.messages] == [offset] and not found_after.detail
    assert record_after is not None and record_after.keys == "k5"


def test_a_reader_that_cannot_list_its_directory_keeps_its_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unlistable directory (EMFILE: listing takes a descriptor too) is no news of files
    gone: the reader dropped every map as if each segment were deleted."""
    with mqstore.open(tmp_path / "s", mapped_file_size_commitlog_bytes=SEGMENT) as s:
        offset = s.put(Message("T", b"x" * 30_000)).commitlog_offset
        s.flush()
        reader = CommitLogReader(RealFileSystem(), str(tmp_path / "s" / "commitlog"), mapped_file_size=SEGMENT,
                                 limit=s.read_view.view.readable_end)  # fmt: skip
        try:
            assert reader.read(offset, 4) is not None
            pressure = Pressure(monkeypatch, "list", errno.EMFILE)
            pressure.run(reader.refresh)
            assert reader.read(offset, 4) is not None and reader.map_errors
            reader.refresh()
            assert not reader.map_errors and reader.map_error(offset) is None
        finally:
            reader.close()


@pytest.mark.parametrize(
    ("err", "hint"),
    [(errno.EACCES, "owner and mode"), (errno.EPERM, "owner and mode"), (errno.EMFILE, "descriptors and memory")],
)
def test_the_hint_of_a_get_that_cannot_map_follows_the_errno(
    store: tuple[MessageStore, list[Any]], monkeypatch: pytest.MonkeyPatch, err: int, hint: str
) -> None:
    """Review 65 F6: a segment the process may not open (EACCES, EPERM: a root-owned copy, a
    chmod, an immutable attribute) was answered with "ask again once the process has
    descriptors and memory to spare", the advice for EMFILE and ENOMEM."""
    s, _ = store
    pressure = Pressure(monkeypatch, "map", err)
    under = in_new_thread(lambda: pressure.run(lambda: s.get("T", 0, 3, 8)))
    assert under.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE and "could not be mapped now" in under.detail
    assert hint in under.detail
    wrong = "descriptors and memory" if hint == "owner and mode" else "owner and mode"
    assert wrong not in under.detail


def test_the_hint_of_a_queue_reply_follows_the_errno_in_its_text() -> None:
    """The ConsumeQueue actor's reply carries the error as text ("Type: [Errno N] ...")."""
    from mqstore.reads import retry_hint

    assert "owner and mode" in retry_hint("PermissionError: [Errno 13] Permission denied: '/s/consumequeue/T/0/0'")
    assert "owner and mode" in retry_hint(PermissionError(errno.EPERM, "Operation not permitted"))
    assert "descriptors and memory" in retry_hint("OSError: [Errno 24] Too many open files")
    assert "descriptors and memory" in retry_hint(OSError(errno.ENOMEM, "Cannot allocate memory"))
