"""The C read loop (`_native.decode_units`, called by reads.collect) and the GIL hand-off
(`_native.yield_gil`), issue 18: a get through the C loop returns exactly what the Python loop,
the reference, returns (same statuses, records, next offsets, details), on plain, unusual and
damaged records; MQSTORE_PURE_PYTHON=1 keeps the Python loop."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from mqstore import GetResult, Message, MessageStore
from mqstore.storage import codec, speedups

h = sys.modules["mqstore_read_test_helpers"]  # loaded by conftest.py
Open = Callable[..., MessageStore]
native = speedups.native
needs_native = pytest.mark.skipif(native is None, reason="the C extension is not built or MQSTORE_PURE_PYTHON=1")
SEGMENT = 64 << 10  # small commitlog segments: runs end at segment ends (blank records there)
BODY_AT = 88  # the body of a record with IPv4 hosts


def _mixed(store: MessageStore, n: int) -> list[Any]:
    """n messages in T/0 of every shape the decoder meets, interleaved with other queues' records."""
    results = []
    for i in range(n):
        props = {"a": "1", "ü": "ß" * (1 + i % 3)} if i % 7 == 0 else {}
        born = "[2001:db8::1]:9876" if i % 11 == 0 else None
        message = Message(topic="T", queue_id=0, body=bytes([i % 251]) * (i * 37 % 3000), tags=f"tag{i % 3}",
                          keys=[f"k{i}", f"k{i}b"] if i % 5 else f"k{i}", properties=props, born_host=born)  # fmt: skip
        result = store.put(message)
        assert result.ok, result
        results.append(result)
        if i % 4 == 0:
            assert store.put(Message(topic="Other", queue_id=i % 2, body=b"o" * (i % 100))).ok
    assert store.wait_for_messages("T", 0, n - 1, timeout_s=10)
    return results


def _gets(store: MessageStore, n: int) -> list[GetResult]:
    asks = [(0, 32, None), (0, 1, None), (5, 32, 4000), (1, 200, None), (n - 3, 32, None), (n, 32, None),
            (n + 4, 32, None), (17, 64, 1)]  # fmt: skip
    out = [store.get("T", 0, offset, count, max_total_bytes=total) for offset, count, total in asks]
    offset = 0
    while offset < n:  # reading it all in order, as the bench does
        got = store.get("T", 0, offset, 32)
        out.append(got)
        offset = got.next_begin_offset
    return out


def _both_ways(store: MessageStore, n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[GetResult], list[GetResult], int]:
    """The gets through the C loop, the same gets through the Python loop, and how many units
    the C loop took."""
    assert native is not None
    taken = [0]
    real = native.decode_units

    def counting(*args: Any) -> Any:
        found = real(*args)
        taken[0] += (found[0] - args[1]) // 20
        return found

    monkeypatch.setattr(native, "decode_units", counting)
    fast = _gets(store, n)
    monkeypatch.setattr(speedups, "native", None)
    reference = _gets(store, n)
    monkeypatch.setattr(speedups, "native", native)
    return fast, reference, taken[0]


@needs_native
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"check_crc_on_read": True},
        # every record "on disk", and small transfer limits, so batch_full stops runs
        {"access_message_in_memory_max_ratio_percent": 0, "max_transfer_count_on_message_in_disk": 5,
         "max_transfer_bytes_on_message_in_disk": 9000},  # fmt: skip
        {"max_transfer_count_on_message_in_memory": 7, "max_transfer_bytes_on_message_in_memory": 20000},
    ],
    ids=["plain", "crc", "on_disk_limits", "in_memory_limits"],
)
def test_the_c_loop_returns_what_the_python_loop_returns(
    open_store: Open, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any]
) -> None:
    store = open_store(mapped_file_size_commitlog_bytes=SEGMENT, **settings)
    n = 150
    _mixed(store, n)
    fast, reference, taken = _both_ways(store, n, monkeypatch)
    assert fast == reference
    assert taken > n  # the C loop did the work (the in-order pass alone is n units)
    assert [m.queue_offset for g in fast[8:] for m in g.messages] == list(range(n))


def _damage(root: Path, commitlog_offset: int, at: int, xor: int) -> None:
    name = codec.segment_file_name(commitlog_offset - commitlog_offset % SEGMENT)
    with open(root / "commitlog" / name, "r+b") as f:
        f.seek(commitlog_offset % SEGMENT + at)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ xor]))


@needs_native
@pytest.mark.parametrize("check_crc", [True, False])
def test_damaged_records_read_the_same_through_both_loops(
    open_store: Open, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check_crc: bool
) -> None:
    """A flipped body byte (skipped under check_crc_on_read), a broken magic code and a record
    whose queue offset is not its unit's: the C loop stops at each and the Python loop decides."""
    store = open_store(mapped_file_size_commitlog_bytes=SEGMENT, check_crc_on_read=check_crc)
    n = 60
    results = _mixed(store, n)
    root = tmp_path / "store"
    _damage(root, results[3].commitlog_offset, BODY_AT + 3 + 16, 0x10)  # IPv6-free record 3: its body (if any)
    _damage(root, results[20].commitlog_offset, 4, 0xFF)  # the magic code
    _damage(root, results[41].commitlog_offset, 20 + 7, 0x01)  # QUEUEOFFSET's low byte
    fast, reference, taken = _both_ways(store, n, monkeypatch)
    assert fast == reference
    assert taken > 0
    served = {m.queue_offset for g in fast for m in g.messages}
    assert 20 not in served and 41 not in served and 40 in served and 42 in served
    assert (3 in served) is not check_crc


@needs_native
def test_decode_units_stops_where_the_python_loop_decides(open_store: Open) -> None:
    """Called directly: a filler unit, a unit of another segment, a size cut by the readable
    end, and a queue place that differs each stop the run before that unit."""
    assert native is not None
    store = open_store()
    results = h.put_n(store, 4)
    reader = store._readers.get().commitlog_reader()
    place = reader.select(0, 1)
    assert place is not None
    buf = place[0]
    units = b"".join(codec.encode_cq_unit(r.commitlog_offset, r.wrote_bytes, 0) for r in results)
    filler = codec.encode_cq_unit(0, 0x7FFFFFFF, 0)
    limits = (1 << 30, 1 << 30, 1 << 30, 1 << 30)

    def run(units: bytes, *, seg_limit: int = 1 << 20, first: int = 0, topic: str = "T") -> tuple[int, int]:
        out: list[Any] = []
        i, count, total = native.decode_units(units, 0, len(units), buf, 0, seg_limit, 4 << 20, codec.MessageRecord,
                                              codec.host_from_bytes, False, topic, 0, first, 0, 0, 32, -1, 0, 0,
                                              limits, out)  # fmt: skip
        assert count == len(out) and total == sum(r.wrote_bytes for r in results[:count])
        assert [m.queue_offset for m in out] == list(range(first, first + count))
        return i // 20, count

    assert run(units) == (4, 4)
    assert run(units[:40] + filler + units[40:]) == (2, 2)
    assert run(units, seg_limit=results[2].commitlog_offset + results[2].wrote_bytes - 1) == (2, 2)
    assert run(units, first=1) == (0, 0)
    assert run(units, topic="U") == (0, 0)
    with pytest.raises(TypeError):
        native.decode_units(units, 0, 20, buf, 0, 1 << 20)


@contextlib.contextmanager
def _holding_the_gil() -> Iterator[None]:
    """No switch interval runs out inside: this thread keeps the GIL until it gives it away
    itself (yield_gil). At the default 5 ms the woken thread, kept waiting that long, forced the
    GIL away and took it between the loop that saw it counted and the checks after (a loaded
    machine: its count was 0 again at the check)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


@needs_native
def test_yield_gil_hands_the_gil_to_a_woken_thread_and_costs_nothing_otherwise() -> None:
    """The catch-up case of issue 15 without a clock: a thread a Signal woke is counted while it
    waits for the GIL, and yield_gil lets it take it; with none waiting yield_gil returns False."""
    assert native is not None
    assert native.woken_awaiting_gil() == 0
    time.sleep(0.05)  # past the busy window of any hand-off before this test (20 ms)
    assert native.yield_gil() is False
    signal = native.Signal()
    ran: list[int] = []
    about_to_wait = threading.Event()

    def woken() -> None:
        about_to_wait.set()
        signal.wait(10.0)
        ran.append(1)

    thread = threading.Thread(target=woken)
    thread.start()
    assert about_to_wait.wait(10)
    time.sleep(0.05)  # it blocks in wait
    with _holding_the_gil():
        signal.post_holding_gil()
        deadline = time.monotonic() + 5
        while native.woken_awaiting_gil() == 0 and time.monotonic() < deadline:
            pass  # holding the GIL: the woken thread waits for it
        assert native.woken_awaiting_gil() == 1
        assert native.yield_gil() is True
    thread.join(10)
    assert ran == [1] and native.woken_awaiting_gil() == 0
    time.sleep(0.05)  # (within 20 ms of the hand-off it would give the CPU away once more)
    assert native.yield_gil() is False


def test_reads_work_the_same_without_the_c_extension(tmp_path: Path) -> None:
    """MQSTORE_PURE_PYTHON=1: a fresh process reads through the Python loop (and yields with
    time.sleep(0)) and gets the same messages."""
    script = (
        "import mqstore, sys\n"
        "from mqstore.storage import speedups\n"
        "from mqstore import reads\n"
        "assert speedups.native is None\n"
        "with mqstore.open(sys.argv[1]) as s:\n"
        "    for i in range(40): assert s.put(mqstore.Message(topic='T', body=b'b%d' % i, keys=[f'k{i}'])).ok\n"
        "    assert s.wait_for_messages('T', 0, 39, 10)\n"
        "    got = s.get('T', 0, 3, 32)\n"
        "    assert [m.body for m in got.messages] == [b'b%d' % i for i in range(3, 35)], got\n"
        "    assert got.next_begin_offset == 35\n"
        "    assert s.query('T', 'k7').messages[0].body == b'b7'\n"
        "    reads.yield_gil()\n"
    )
    env = dict(os.environ, MQSTORE_PURE_PYTHON="1")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "s")], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr


@needs_native
def test_a_forked_child_does_not_wait_for_its_parents_threads() -> None:
    """A fork while a woken thread waits for the GIL: the child has no such thread, so its
    count is 0 (else every read of a store opened in the child would wait 2 ms to hand over)."""
    assert native is not None
    signal = native.Signal()
    about_to_wait = threading.Event()
    thread = threading.Thread(target=lambda: (about_to_wait.set(), signal.wait(10.0)))
    thread.start()
    assert about_to_wait.wait(10)
    time.sleep(0.05)
    with _holding_the_gil():
        signal.post_holding_gil()
        deadline = time.monotonic() + 5
        while native.woken_awaiting_gil() == 0 and time.monotonic() < deadline:
            pass
        assert native.woken_awaiting_gil() == 1
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once
            os._exit(0 if native.woken_awaiting_gil() == 0 else 1)
        native.yield_gil()
    thread.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
