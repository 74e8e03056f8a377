"""A page of a store file that cannot be read while a reader touches it (an I/O error on the
disk, or the file cut short by another process meanwhile) faults; the SIGBUS guard hands the
reader zeros for it (review 67 F1, F7). Taken for content, the zeros made a get answer FOUND
with next_begin_offset past 49 acknowledged messages (a consumer commits that), the thread's
map kept them after the disk read again, and a query or lookup said "no such message". Now the
reader stops before what it could not read and says so (EIO, the file named), drops the map,
and reads the file again on the next call.

The fault is made for real: the file is cut short after the reader mapped it and before it
touches the page, and given its bytes back after (the disk's error gone). Each test runs in a
forked child: a fault the guard did not catch kills the child, not the test runner."""

from __future__ import annotations

import errno
import functools
import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import GetMessageStatus, MessageStore, reads
from mqstore.storage import codec, mapguard

pytestmark = pytest.mark.skipif(not mapguard.available, reason="storage/_mapguard.c not built: a fault would kill the run")

SEG = 64 * 1024
MESSAGES = 100
SETTINGS = {"mapped_file_size_commitlog_bytes": SEG, "max_hash_slot_num": 5000, "max_index_num": 2000}


def in_child(test: Callable[..., None]) -> Callable[..., None]:
    """Run `test` in a forked child; its failure (or a signal that killed it) is the test's."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            os.close(read_end)
            try:
                test(*args, **kwargs)
                said = b"ok"
            except BaseException:
                said = traceback.format_exc().encode()
            os.write(write_end, said)
            os._exit(0)
        os.close(write_end)
        chunks = []
        with os.fdopen(read_end, "rb") as pipe:
            while select.select([pipe], [], [], 120)[0]:
                chunk = pipe.read1(65536)
                if not chunk:
                    break
                chunks.append(chunk)
            else:
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert not os.WIFSIGNALED(status), f"the child died of signal {os.WTERMSIG(status)}"
        said = b"".join(chunks).decode()
        assert said == "ok", said

    return run


def _body(i: int) -> bytes:
    return bytes([65 + i % 26]) * 1000


def _fill(store: Path, pause_s: float = 0.0, **settings: Any) -> MessageStore:
    s = mqstore.open(store, **SETTINGS, **settings)
    for i in range(MESSAGES):
        # (a long second key: a page boundary falls inside some record's properties)
        assert s.put(mqstore.Message(topic="t", body=_body(i), tags="A", keys=[f"k{i}", "p" * 300])).ok
        time.sleep(pause_s)
    assert s.wait_for_messages("t", 0, MESSAGES - 1, 10)
    return s


class Cut:
    """`path` cut to `at` bytes (its pages past that fault when touched); `restore` gives its bytes back."""

    def __init__(self, path: Path, at: int) -> None:
        self.path, self.saved = path, path.read_bytes()
        os.truncate(path, at)

    def restore(self) -> None:
        with open(self.path, "r+b") as f:
            f.write(self.saved)


def _segment(store: Path, n: int) -> Path:
    return sorted((store / "commitlog").iterdir())[n]


def _served(result: mqstore.GetResult, raw: bool) -> list[tuple[int, bytes]]:
    """(queue offset, body) of each record served, each checked whole (its keys)."""
    records = [codec.read_served(data, 0) for data in result.raw] if raw else list(result.messages)
    assert all(isinstance(r, codec.MessageRecord) for r in records)
    assert all(r.key_list == [f"k{r.queue_offset}", "p" * 300] and r.tags == "A" for r in records)  # type: ignore[union-attr]
    return [(r.queue_offset, r.body) for r in records]  # type: ignore[union-attr]


def _get(s: MessageStore, offset: int, mode: str) -> mqstore.GetResult:
    return s.get("t", 0, offset, 32, raw=mode == "raw", tags="A" if mode == "tags" else None)


MODES = ["view", "owner", "raw", "tags"]


def _owner_only(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    if mode == "owner":  # the ConsumeQueue actor's units, read through the same thread's maps
        monkeypatch.setattr(reads, "get_from_view", lambda *a, **k: None)


@pytest.mark.parametrize("mode", MODES)
@in_child
def test_a_get_whose_first_record_faults_keeps_the_offset_and_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    _owner_only(monkeypatch, mode)
    store = tmp_path / "store"
    with _fill(store) as s:
        assert _get(s, 0, mode).status is GetMessageStatus.FOUND  # the thread's maps made
        segment = _segment(store, 0)
        cut = Cut(segment, 8192)  # queue offset 10 lies at ~11 KB
        during = _get(s, 10, mode)
        cut.restore()
        assert during.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, during
        assert during.next_begin_offset == 10 and not during.messages and not during.raw
        assert segment.name in during.detail and "I/O error" in during.detail, during.detail
        after = _get(s, 10, mode)  # the same thread: its map was dropped, the file mapped again
        assert after.status is GetMessageStatus.FOUND and after.next_begin_offset == 42
        assert _served(after, mode == "raw") == [(q, _body(q)) for q in range(10, 42)]


def _page_in_properties(s: MessageStore) -> tuple[int, int]:
    """A page boundary of segment 0 past queue offset 10 that falls inside a record's
    properties (a fault there zeroes their tail only: the record still decodes), and that
    record's queue offset."""
    for m in s.get("t", 0, 11, 64).messages:
        end = m.commitlog_offset + m.total_size
        page = end - end % 4096
        if m.commitlog_offset < SEG and end - 300 < page < end:
            return page, m.queue_offset
    raise AssertionError("no page boundary inside a record's properties")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["record_start", "properties"])
@in_child
def test_a_get_that_meets_a_fault_serves_what_it_read_before_it_and_stops_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, where: str
) -> None:
    _owner_only(monkeypatch, mode)
    store = tmp_path / "store"
    # Without the CRC check, a record whose properties' tail is zeroed still decodes.
    with _fill(store, check_crc_on_read=where == "record_start") as s:
        assert _get(s, 0, mode).status is GetMessageStatus.FOUND
        segment = _segment(store, 0)
        if where == "properties":
            at, first_cut = _page_in_properties(s)
        else:
            at = 24576
            first_cut = next(m.queue_offset for m in s.get("t", 0, 0, 64).messages if m.commitlog_offset + m.total_size > at)
        cut = Cut(segment, at)
        during = _get(s, 10, mode)
        cut.restore()
        served = _served(during, mode == "raw")
        assert during.status is GetMessageStatus.FOUND, during
        assert served == [(q, _body(q)) for q in range(10, during.next_begin_offset)]
        assert 10 < during.next_begin_offset <= first_cut  # never past the unit it could not read
        assert segment.name in during.detail
        after = _get(s, during.next_begin_offset, mode)
        assert _served(after, mode == "raw") == [(q, _body(q)) for q in range(during.next_begin_offset, after.next_begin_offset)]
        assert after.next_begin_offset == during.next_begin_offset + 32


def _while_cut(s: MessageStore, segment: Path, read: Callable[[], Any]) -> Any:
    """What `read` gives (or raises) while `segment`'s pages past 8 KiB fault. (Cut by a
    truncate, a map made meanwhile would see a short file; a real EIO keeps the size, so the
    thread's map is made before the cut.)"""
    assert s.lookup(0) is not None
    cut = Cut(segment, 8192)
    try:
        return read()
    except OSError as exc:
        return exc
    finally:
        cut.restore()


@in_child
def test_lookup_and_store_time_of_a_record_whose_page_faults_say_not_now(tmp_path: Path) -> None:
    store = tmp_path / "store"
    # Each record its own store time: the search by time starts in the middle of the queue,
    # in segment 1, and goes on into the cut segment 0 only if the record there was stored
    # later than record 40 (in the same millisecond it answered from segment 1 alone: 49).
    with _fill(store, pause_s=0.002) as s:
        record = s.get("t", 0, 40, 1).messages[0]
        segment = _segment(store, 0)
        assert record.commitlog_offset < SEG <= s.get("t", 0, MESSAGES // 2 - 1, 1).messages[0].commitlog_offset
        for lookup in (lambda: s.lookup(record.commitlog_offset), lambda: s.lookup(record.commitlog_offset, record.total_size)):
            refused = _while_cut(s, segment, lookup)
            assert isinstance(refused, OSError) and refused.errno == 5 and segment.name in str(refused), refused
            assert lookup() == record  # the map dropped: the file read again
        assert _while_cut(s, segment, lambda: s.message_store_time("t", 0, 40)) == -1
        assert s.message_store_time("t", 0, 40) == record.store_timestamp
        by_time = s.offset_for_time("t", 0, record.store_timestamp)
        assert _while_cut(s, segment, lambda: s.offset_for_time("t", 0, record.store_timestamp)) == -1
        assert s.offset_for_time("t", 0, record.store_timestamp) == by_time


@pytest.mark.parametrize("faulting", ["record", "index"])
@in_child
def test_a_query_whose_record_or_index_page_faults_names_the_file(tmp_path: Path, faulting: str) -> None:
    store = tmp_path / "store"
    with _fill(store) as s:
        assert len(s.query("t", "k80").messages) == 1
        if faulting == "record":
            path, cut_to = _segment(store, 1), 0  # k80's record
        else:
            (path,) = sorted((store / "index").iterdir())
            cut_to = 4096  # the slots past the first page and every entry
        cut = Cut(path, cut_to)
        during = s.query("t", "k80")
        cut.restore()
        assert not during.messages and path.name in during.detail and "I/O error" in during.detail, during
        assert [m.queue_offset for m in s.query("t", "k80").messages] == [80]


@in_child
def test_every_query_while_an_index_file_stays_cut_names_it(tmp_path: Path) -> None:
    """Review 87 F3: the first query named the cut file; the reader could not map it again (its
    size), asked the index actor, and the actor's walk read its own faulted map: every later
    query answered no hits, no detail."""
    store = tmp_path / "store"
    with _fill(store) as s:
        (path,) = sorted((store / "index").iterdir())
        cut = Cut(path, 4096)
        answers = [s.query("t", "k80") for _ in range(4)]
        cut.restore()
        for during in answers:
            assert not during.messages and path.name in during.detail and "I/O error" in during.detail, during
        assert [m.queue_offset for m in s.query("t", "k80").messages] == [80]  # (read through a map made anew)


@in_child
def test_a_query_whose_shared_index_map_another_thread_gave_back_still_names_the_fault(tmp_path: Path) -> None:
    """Review 87 F1: querying threads share one map per index file. Thread A's walk read the
    guard's zeros; before A looked for faults, thread B looked, found the shared map faulted and
    closed it; A's look skipped closed maps and answered no hits, no detail. (The switch from A
    to B is made at the one point between A's walk and its look, where CPython may switch.)"""
    store = tmp_path / "store"
    with _fill(store) as s:
        assert s.query("t", "k80").messages
        b_ready, b_go, b_done = threading.Event(), threading.Event(), threading.Event()
        b_answer: list[mqstore.QueryResult] = []

        def thread_b() -> None:
            s.query("t", "k1")  # B's reader, synced to the same shared maps
            b_ready.set()
            b_go.wait(10)
            b_answer.append(s.query("t", "k81"))
            b_done.set()

        b = threading.Thread(target=thread_b)
        b.start()
        assert b_ready.wait(10)
        real_query_direct, a = reads.query_direct, threading.get_ident()

        def then_b(*args: Any, **kwargs: Any) -> Any:
            found = real_query_direct(*args, **kwargs)
            if threading.get_ident() == a and not b_go.is_set():
                b_go.set()
                assert b_done.wait(10)
            return found

        reads.query_direct = then_b  # type: ignore[assignment]
        try:
            (path,) = sorted((store / "index").iterdir())
            cut = Cut(path, 4096)
            during = s.query("t", "k80")
        finally:
            reads.query_direct = real_query_direct
            b_go.set()
            b.join(10)
        cut.restore()
        assert b_answer and path.name in b_answer[0].detail
        assert not during.messages and path.name in during.detail and "I/O error" in during.detail, during
        assert [m.queue_offset for m in s.query("t", "k80").messages] == [80]


@in_child
def test_a_get_whose_consume_queue_page_faults_keeps_the_offset_and_reads_it_once_it_reads(tmp_path: Path) -> None:
    """The units a get reads, from its own map and then the queue owner's: zeros read as no
    units, and the get answered NO_MATCHED_MESSAGE with next_begin_offset 100, past 60
    acknowledged messages, in that thread after the disk read again too."""
    store = tmp_path / "store"
    with _fill(store, mapped_file_size_consume_queue_bytes=20 * 100) as s:
        assert len(s.get("t", 0, 10, 32).messages) == 32  # the thread maps the queue file
        queue_file = store / "consumequeue" / "t" / "0" / f"{0:020d}"
        cut = Cut(queue_file, 0)
        during = s.get("t", 0, 40, 32)
        cut.restore()
        assert during.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE and during.next_begin_offset == 40, during
        assert queue_file.name in during.detail and "I/O error" in during.detail, during
        after = s.get("t", 0, 40, 32)
        assert [m.queue_offset for m in after.messages] == list(range(40, 72))
        assert [m.body for m in after.messages] == [_body(i) for i in range(40, 72)]


@in_child
def test_offset_for_time_whose_consume_queue_page_faults_says_not_now(tmp_path: Path) -> None:
    """Searched through units read as zeros, the answer was an offset (the queue's start)."""
    store = tmp_path / "store"
    with _fill(store, mapped_file_size_consume_queue_bytes=20 * 100) as s:
        stamp = s.message_store_time("t", 0, 60)
        by_time = s.offset_for_time("t", 0, stamp)
        queue_file = store / "consumequeue" / "t" / "0" / f"{0:020d}"
        cut = Cut(queue_file, 0)
        during = s.offset_for_time("t", 0, stamp)
        cut.restore()
        assert during == -1
        assert s.offset_for_time("t", 0, stamp) == by_time


@in_child
def test_get_commitlog_data_of_a_page_that_faults_raises_and_serves_the_log_once_it_reads(tmp_path: Path) -> None:
    """The replication source served the guard's zeros as the log's bytes, in that thread
    after the disk read again too (review 68 F3): a replica appended them."""
    store = tmp_path / "store"
    with _fill(store) as s:
        segment = _segment(store, 0)
        good = segment.read_bytes()
        assert s.get_commitlog_data(0, 4096) == (0, good[:4096])  # the thread maps segment 0
        cut = Cut(segment, 8192)
        with pytest.raises(OSError) as unread:
            s.get_commitlog_data(16384, 16384)
        cut.restore()
        assert unread.value.errno == errno.EIO and unread.value.filename == str(segment)
        assert s.get_commitlog_data(16384, 16384) == (16384, good[16384:32768])


@in_child
def test_a_queue_owner_whose_map_faults_loses_no_unit_it_writes_after(tmp_path: Path) -> None:
    """The owner's map of the queue file being written faulted in a get: it could not be
    given back while it had units to flush, so gets of the queue answered NO_MATCHED_LOGIC_QUEUE
    after the disk read again, the units of later puts went into the guard's zero pages, and
    once the map was given back a get answered NO_MATCHED_MESSAGE past them (review 68 F1).
    Now the owner fails and its restart reads the file again and re-dispatches what it lacks."""
    store = tmp_path / "store"
    queue_file = store / "consumequeue" / "t" / "0" / f"{0:020d}"
    with _fill(store, flush_consume_queue_thorough_interval_ms=2000) as s:
        from_view = reads.get_from_view
        reads.get_from_view = lambda *_args, **_kwargs: None  # every get asks the owner
        undo = _select_faulting_once(queue_file, None)
        during = s.get("t", 0, 40, 32)
        assert undo() and during.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE and during.next_begin_offset == 40
        for i in range(MESSAGES, MESSAGES + 50):
            assert s.put(mqstore.Message(topic="t", body=_body(i), tags="A", keys=[f"k{i}"])).ok
        assert s.wait_for_messages("t", 0, MESSAGES + 49, 10)
        time.sleep(2.5)  # past the owner's thorough flush (2 s)
        for owner_path in (True, False):
            reads.get_from_view = (lambda *_args, **_kwargs: None) if owner_path else from_view
            served: list[int] = []
            offset = 0
            while offset < MESSAGES + 50:
                got = s.get("t", 0, offset, 32)
                served += [m.queue_offset for m in got.messages]
                if got.next_begin_offset <= offset:
                    break
                offset = got.next_begin_offset
            assert served == list(range(MESSAGES + 50)), (owner_path, got)


def _select_faulting_once(queue_file: Path, cut_to: int | None) -> Callable[[], bool]:
    """The next owner read of `queue_file` (MappedFile.select) meets a fault: the file is cut
    to 0 for it and written back after (cut_to None), or cut to `cut_to` and left so. Undo
    (it says whether the fault was made)."""
    from mqstore.storage.mapped_file import MappedFile

    select = MappedFile.select
    done: list[bool] = []

    def select_faulting(self: MappedFile, *args: Any) -> Any:
        if done or self.file_name != str(queue_file):
            return select(self, *args)
        done.append(True)
        if cut_to is not None:
            os.truncate(queue_file, cut_to)
            return select(self, *args)
        self._mapped()  # (an idle queue's file is mapped for the read)
        cut = Cut(queue_file, 0)
        try:
            return select(self, *args)
        finally:
            cut.restore()

    MappedFile.select = select_faulting  # type: ignore[method-assign]

    def undo() -> bool:
        MappedFile.select = select  # type: ignore[method-assign]
        return bool(done)

    return undo


@in_child
def test_an_idle_queue_whose_page_faults_in_the_owners_read_is_not_served_as_no_units(tmp_path: Path) -> None:
    """The owner maps an idle queue's file for one read and gives it back after: it asked for a
    fault only after, saw none, and served the zeros as no units (NO_MATCHED_MESSAGE, next 100
    from 40: review 69 F2)."""
    store = tmp_path / "store"
    with _fill(store, consume_queue_mapped_queues_max=1) as s:
        assert s.put(mqstore.Message(topic="other", body=b"o")).ok  # queue t/0 is idle now
        assert s.wait_for_messages("other", 0, 0, 10)
        reads.get_from_view = lambda *_args, **_kwargs: None  # the owner's units
        undo = _select_faulting_once(store / "consumequeue" / "t" / "0" / f"{0:020d}", None)
        during = s.get("t", 0, 40, 32)
        undo()
        assert during.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE and during.next_begin_offset == 40, during
        after = s.get("t", 0, 40, 32)
        assert [m.queue_offset for m in after.messages] == list(range(40, 72))
        assert s.supervisor.restarts == []


@in_child
def test_a_get_of_an_idle_queue_whose_file_was_cut_answers_and_the_queue_is_rebuilt(tmp_path: Path) -> None:
    """The owner could not map the cut file again and the get raised FileCutUnderMapError to
    the caller, at every get (review 69 F5). Now it answers "not now", and the owner's restart
    rebuilds the queue from the log."""
    store = tmp_path / "store"
    queue_file = store / "consumequeue" / "t" / "0" / f"{0:020d}"
    with _fill(store, consume_queue_mapped_queues_max=1) as s:
        assert s.put(mqstore.Message(topic="other", body=b"o")).ok
        assert s.wait_for_messages("other", 0, 0, 10)
        reads.get_from_view = lambda *_args, **_kwargs: None
        os.truncate(queue_file, 4096)  # cut while not mapped: the owner maps it again for the read
        during = s.get("t", 0, 40, 32)
        assert during.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE and during.next_begin_offset == 40, during
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            after = s.get("t", 0, 40, 32)
            if after.found:
                break
            time.sleep(0.05)
        assert [m.queue_offset for m in after.messages] == list(range(40, 72)), after


@in_child
def test_a_queue_page_that_stays_unreadable_for_seconds_stops_nothing_else(tmp_path: Path) -> None:
    """The owner failed at its map's fault and every restart's recovery met the page again: the
    restart budget ran out in ~4 s and the whole store stopped (puts to every topic refused)
    while the disk's error lasted 8 s (review 69 F1). Now the owner gives the faulted map back
    and answers "not now" for that queue while the page faults; everything else goes on."""
    from mqstore.storage.mapped_file import MappedFile

    store = tmp_path / "store"
    queue_file = store / "consumequeue" / "t" / "0" / f"{0:020d}"
    with _fill(store) as s:
        reads.get_from_view = lambda *_args, **_kwargs: None
        select = MappedFile.select
        saved = queue_file.read_bytes()

        def select_while_unreadable(self: MappedFile, *args: Any) -> Any:
            if self.file_name != str(queue_file):
                return select(self, *args)
            self._mapped()  # (mapped at its length, as a file with an I/O error keeps it)
            os.truncate(queue_file, 0)  # unreadable for this read (every one for a while)
            try:
                return select(self, *args)
            finally:
                with open(queue_file, "r+b") as f:
                    f.write(saved)

        MappedFile.select = select_while_unreadable  # type: ignore[method-assign]
        try:
            for i in range(30):  # ~3 s of gets of the queue, each meeting the fault
                got = s.get("t", 0, 40, 32)
                assert got.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE and got.next_begin_offset == 40, got
                put = s.put(mqstore.Message(topic="other", body=b"%d" % i))
                assert put.ok, (i, put, s.supervisor.restarts)
                time.sleep(0.1)
        finally:
            MappedFile.select = select  # type: ignore[method-assign]
        assert s.supervisor.state.name == "RUNNING" and s.supervisor.restarts == []
        assert [m.queue_offset for m in s.get("t", 0, 40, 32).messages] == list(range(40, 72))
        assert s.wait_for_messages("other", 0, 29, 10)


@in_child
def test_a_queue_write_that_faults_in_a_batch_with_other_queues_is_redone_by_the_restart(tmp_path: Path) -> None:
    """Review 70 H3 (found on a full btrfs, where a store through the map faults on a file that
    stays whole): the units a batch wrote into a faulted map of one queue were gone, the file
    kept its length, and another queue of the batch had units past them. The restarted owner
    re-dispatched from the highest unit of any queue, past the lost ones: the queue's next
    record got filler units over the acknowledged messages (a consumer skips them), and a
    writer restarted with it would hand their queue offsets out again (H2). Here the file is
    cut for the write and given its bytes back after: whole, without the batch's units."""
    from mqstore.actors.consume_queue import ConsumeQueueService
    from mqstore.storage.consume_queue import ConsumeQueue

    store = tmp_path / "store"
    queue_file = store / "consumequeue" / "t" / "0" / f"{0:020d}"
    armed: list[bool] = []
    faulted: list[int] = []
    dispatch = ConsumeQueueService._dispatch

    def dispatch_arming(self: ConsumeQueueService, batch: Any) -> None:
        topics = [request.topic for request in batch.requests]
        if not faulted and "t" in topics and "u" in topics[topics.index("t") :]:
            armed.append(True)  # t's run, then u's: u's units end past t's
        try:
            dispatch(self, batch)
        finally:
            armed.clear()

    def faulting(write: Callable[..., bool]) -> Callable[..., bool]:
        def write_into_a_cut_file(self: ConsumeQueue, *args: Any) -> bool:
            if not armed or faulted or self.topic != "t":
                return write(self, *args)
            faulted.append(1)
            cut = Cut(queue_file, 0)
            try:
                return write(self, *args)
            finally:
                cut.restore()

        return write_into_a_cut_file

    with mqstore.open(store, **SETTINGS) as s:
        assert s.put(mqstore.Message(topic="t", body=_body(0))).ok and s.put(mqstore.Message(topic="u", body=_body(0))).ok
        assert s.wait_for_messages("t", 0, 0, 10) and s.wait_for_messages("u", 0, 0, 10)
        ConsumeQueueService._dispatch = dispatch_arming  # type: ignore[method-assign]
        put_dense_run, put_infos = ConsumeQueue.put_dense_run, ConsumeQueue.put_message_position_infos
        ConsumeQueue.put_dense_run = faulting(put_dense_run)  # type: ignore[method-assign]
        ConsumeQueue.put_message_position_infos = faulting(put_infos)  # type: ignore[method-assign]
        try:
            for round_ in range(1, 40):
                futures = [s.put_async(mqstore.Message(topic=topic, body=_body(round_))) for topic in ("t", "u")]
                assert all(f.result(timeout=30).ok for f in futures)
                if faulted:
                    break
        finally:
            ConsumeQueueService._dispatch = dispatch  # type: ignore[method-assign]
            ConsumeQueue.put_dense_run, ConsumeQueue.put_message_position_infos = put_dense_run, put_infos  # type: ignore[method-assign]
        assert faulted, "no batch held t's record before u's"
        deadline = time.monotonic() + 30
        while not s.supervisor.restarts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r.failed for r in s.supervisor.restarts][:1] == ["consume_queue"], s.supervisor.restarts
        after = s.put(mqstore.Message(topic="t", body=b"after"))
        assert after.ok and after.queue_offset == round_ + 1, after  # no queue offset given twice
        for reopened in (False, True):
            if reopened:
                s.close()
                s = mqstore.open(store, **SETTINGS)
            got = s.get("t", 0, 0, 64)
            assert [m.body for m in got.messages] == [_body(i) for i in range(round_ + 1)] + [b"after"], (reopened, got)
            assert [m.body for m in s.get("u", 0, 0, 64).messages] == [_body(i) for i in range(round_ + 1)]
        s.close()
