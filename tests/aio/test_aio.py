"""mqstore.aio: the store for coroutines (review 75). Each test names the failure of the plain
API in an asyncio service that the aio store does not have."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import mqstore
import mqstore.aio
from mqstore import GetMessageStatus, Message, PutMessageStatus
from mqstore.faults import HoldAt

SETTINGS = dict(
    mapped_file_size_commitlog_bytes=1024 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 1000,
    max_hash_slot_num=64,
    max_index_num=400,
)
TIMEOUT_S = 15.0
REPO = Path(mqstore.__file__).resolve().parent


def _with_writer_held(path: Path, test: Callable[[mqstore.aio.AsyncMessageStore, HoldAt], Awaitable[None]],
                      **settings: object) -> None:  # fmt: skip
    """Run `test(store, hold)` on a store whose writer `hold` stops mid-append once armed;
    released and closed whatever the test does."""
    hold = HoldAt("writer.mid_batch_append", hold_s=TIMEOUT_S * 2)
    sync = mqstore.open(path, faults=hold, **{**SETTINGS, **settings})

    async def run() -> None:
        store = mqstore.aio.AsyncMessageStore(sync)
        try:
            await test(store, hold)
        finally:
            hold.release.set()
            await store.close()

    try:
        asyncio.run(run())
    finally:
        hold.release.set()
        sync.close()


async def _until_held(hold: HoldAt) -> None:
    while not hold.entered.is_set():
        await asyncio.sleep(0.01)


def test_puts_gets_and_queries_through_coroutines_and_the_store_closes_with_the_block(tmp_path: Path) -> None:
    async def main() -> None:
        async with mqstore.aio.open(tmp_path / "s", **SETTINGS) as store:
            results = await asyncio.gather(*(store.put(Message("t", b"%d" % i, keys=[f"k{i}"])) for i in range(200)))
            assert all(r.ok for r in results) and sorted(r.queue_offset for r in results) == list(range(200))
            batch = await store.put_batch([Message("t", b"b0"), Message("t", b"b1")])
            assert batch.ok and batch.msg_num == 2
            got = await store.get("t", 0, 200, 32)
            assert got.status is GetMessageStatus.FOUND and [m.body for m in got.messages] == [b"b0", b"b1"]
            assert got.max_offset == 202
            found = await store.query("t", "k7")
            assert [m.body for m in found.messages] == [b"7"]
            await store.flush()
        assert store.sync.closed

    asyncio.run(main())
    with mqstore.open(tmp_path / "s") as reopened:
        assert reopened.max_offset("t", 0) == 202


def test_a_task_reads_its_own_put_whichever_thread_reads_for_it(tmp_path: Path) -> None:
    """The read contract is per thread; a task's put is acknowledged on the loop thread and its
    read runs on another: the plain API's get answered OFFSET_OVERFLOW_BADLY with
    next_begin_offset 0 (a consumer's rewind) or an empty query, in 209 and 384 of 500 tries.
    The aio store carries the put's end in the task's context."""

    async def one(store: mqstore.aio.AsyncMessageStore, i: int) -> None:
        put = await store.put(Message("q%d" % (i % 4), b"%d" % i, keys=[f"key-{i}"]))
        assert put.ok
        got = await store.get(put_topic := "q%d" % (i % 4), 0, put.queue_offset, 1)
        assert got.status is GetMessageStatus.FOUND and got.messages[0].body == b"%d" % i, (put_topic, got)
        found = await store.query(put_topic, f"key-{i}")
        assert [m.body for m in found.messages] == [b"%d" % i], found.detail

    async def main() -> None:
        async with mqstore.aio.open(tmp_path / "s", **SETTINGS) as store:
            for start in range(0, 300, 30):
                await asyncio.gather(*(one(store, i) for i in range(start, start + 30)))

    asyncio.run(main())


def test_a_put_at_the_bound_waits_without_blocking_the_loop_and_a_cancel_before_room_sends_nothing(tmp_path: Path) -> None:
    """put_async at the in-flight bound blocked the loop's thread up to the reply timeout (20 s
    a call). The aio put waits for room by sleeping: the loop goes on, and a put cancelled while
    it waits for room was never sent."""
    async def test(store: mqstore.aio.AsyncMessageStore, hold: HoldAt) -> None:
        assert (await store.put(Message("t", b"first"))).ok
        hold.armed.set()
        taken = [asyncio.ensure_future(store.put(Message("t", b"held %d" % i))) for i in range(4)]
        await _until_held(hold)
        waiting = asyncio.ensure_future(store.put(Message("t", b"no room")))
        ticks = 0
        for _ in range(20):  # the loop runs while the fifth put waits for room
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 20 and not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        hold.release.set()
        assert all(r.ok for r in await asyncio.gather(*taken))
        assert (await store.put(Message("t", b"after"))).ok
        got = await store.get("t", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"first", *(b"held %d" % i for i in range(4)), b"after"]
        assert store.sync.stats()["put_message_failed_times"] == 0  # waiting for room is not a failed put

    _with_writer_held(tmp_path / "s", test, max_puts_in_flight=4)


def test_fail_fast_is_kept_when_the_store_asks_for_it(tmp_path: Path) -> None:
    async def test(store: mqstore.aio.AsyncMessageStore, hold: HoldAt) -> None:
        hold.armed.set()
        taken = [asyncio.ensure_future(store.put(Message("t", b"%d" % i))) for i in range(2)]
        await _until_held(hold)
        refused = await store.put(Message("t", b"no room"))
        assert refused.status is PutMessageStatus.OS_PAGE_CACHE_BUSY
        hold.release.set()
        assert all(r.ok for r in await asyncio.gather(*taken))

    _with_writer_held(tmp_path / "s", test, max_puts_in_flight=2, put_fail_fast_when_in_flight_full=True)


def test_a_cancelled_long_poll_keeps_no_thread_and_wakes_when_a_message_comes(tmp_path: Path) -> None:
    async def main() -> None:
        async with mqstore.aio.open(tmp_path / "s", **SETTINGS) as store:
            waiting = asyncio.ensure_future(store.wait_for_messages("t", 0, 0, math.inf))
            await asyncio.sleep(0.1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            woken = asyncio.ensure_future(store.wait_for_messages("t", 0, 0, math.inf))
            await asyncio.sleep(0.1)
            assert (await store.put(Message("t", b"x"))).ok
            assert await asyncio.wait_for(woken, TIMEOUT_S)
            assert not await store.wait_for_messages("t", 0, 1, 0.3)  # times out: False

    asyncio.run(main())
    deadline = time.monotonic() + mqstore.aio.WAIT_SLICE_S * 4
    while any(t.name.startswith("mqstore-aio") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("mqstore-aio")]


def test_asyncio_run_returns_with_a_cancelled_infinite_wait_and_no_close(tmp_path: Path) -> None:
    """Through asyncio.to_thread, a cancelled `timeout_s=math.inf` wait kept its thread, and
    asyncio.run() (which joins the executor) never returned: the process was still running
    60 s after main() returned. The exit handler closes the forgotten store."""
    script = textwrap.dedent(f"""
        import asyncio, math, sys
        sys.path.insert(0, {str(REPO.parent)!r})
        import mqstore.aio
        async def main():
            store = await mqstore.aio.open({str(tmp_path / "s")!r}, mapped_file_size_commitlog_bytes=1 << 20)
            waiting = asyncio.ensure_future(store.wait_for_messages("t", 0, 0, math.inf))
            await asyncio.sleep(0.2)
            waiting.cancel()
        asyncio.run(main())
        print("returned")
    """)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "returned", done.stderr
    assert time.monotonic() - started < 30


def test_large_puts_that_wait_for_room_give_their_bytes_back(tmp_path: Path) -> None:
    """Review 77 H1: a put of 16 KiB or more took its bytes, found no slot and was refused
    without giving them back; the aio put's retries drained max_put_bytes_in_flight for good."""
    async def test(store: mqstore.aio.AsyncMessageStore, hold: HoldAt) -> None:
        hold.armed.set()
        large = [asyncio.ensure_future(store.put(Message("t", b"x" * 20_000))) for _ in range(12)]
        await _until_held(hold)
        await asyncio.sleep(0.3)  # their retries, every few ms, while there is no slot
        hold.release.set()
        assert all(r.ok for r in await asyncio.gather(*large))
        assert store.sync._puts._bytes.settled() == 0  # noqa: SLF001

    _with_writer_held(tmp_path / "s", test, max_puts_in_flight=2)


def test_a_put_awaited_through_wait_for_or_gather_is_read_back(tmp_path: Path) -> None:
    """Review 77 M2: awaited in a child task (wait_for, gather), the put's end went into that
    task's context: most gets of the put just awaited missed it."""

    async def main() -> None:
        async with mqstore.aio.open(tmp_path / "s", **SETTINGS) as store:
            for i in range(100):
                put = await asyncio.wait_for(store.put(Message("t", b"%d" % i)), TIMEOUT_S)
                (same,) = await asyncio.gather(store.get("t", 0, put.queue_offset, 1))
                assert same.status is GetMessageStatus.FOUND, same

    asyncio.run(main())


def test_calls_after_close_raise_store_closed(tmp_path: Path) -> None:
    async def main() -> None:
        store = await mqstore.aio.open(tmp_path / "s", **SETTINGS)
        assert await store.close()
        for call in (store.get("t", 0, 0), store.query("t", "k"), store.flush(), store.put(Message("t", b"x"))):
            with pytest.raises(mqstore.StoreClosedError):
                await call

    asyncio.run(main())


def test_an_open_cut_short_by_a_timeout_keeps_the_loop_free_and_closes_what_it_opened(tmp_path: Path) -> None:
    """Review 93 M3: `wait_for(mqstore.aio.open(path), 1.0)` on a 2.6 s recovery stalled the
    loop 1.6 s (the opener pool's shutdown waited on it), returned after 2.65 s, and left the
    store it opened to nobody, holding the lock: every later open in the process refused."""
    path = tmp_path / "s"

    def slow_open() -> mqstore.MessageStore:
        time.sleep(1.0)  # a long recovery
        return mqstore.open(path)

    async def main() -> tuple[float, float]:
        stalls: list[float] = []

        async def ticker() -> None:
            while True:
                before = time.monotonic()
                await asyncio.sleep(0.02)
                stalls.append(time.monotonic() - before)

        ticking = asyncio.ensure_future(ticker())
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(mqstore.aio._Opening(slow_open), timeout=0.2)
        waited = time.monotonic() - started
        await asyncio.sleep(1.5)  # the open finishes meanwhile, and its store is closed
        ticking.cancel()
        return waited, max(stalls)

    waited, worst_stall = asyncio.run(main())
    assert waited < 0.6 and worst_stall < 0.5, (waited, worst_stall)
    deadline = time.monotonic() + 10
    while True:  # the unclaimed store's close frees the lock
        try:
            with mqstore.open(path) as store:
                assert store.put(Message("t", b"after")).ok
            break
        except mqstore.StoreLockedError:
            assert time.monotonic() < deadline, "the store the cancelled open made still holds the lock"
            time.sleep(0.05)
