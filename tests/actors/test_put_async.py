"""Pipelined puts (issue 16): put_async futures, the draining writer, the in-flight bound,
the writer crashing mid-pass, and the actor client."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, InvalidStateError, as_completed, wait
from pathlib import Path
from typing import Any, Callable

import pykka
import pytest

from mqstore import FaultPlan, Message, PutMessageStatus, PutResult
from mqstore import put_pipeline
from mqstore.errors import StoreClosedError
from mqstore.log import REPEAT_LOG_INTERVAL_MS
from mqstore.messages import Replied
from mqstore.runtime import RuntimeActor
from mqstore.ticker import ManualTicker

helpers = sys.modules["mqstore_actor_test_helpers"]

COMPLETION_THREAD = "mqstore-put-completions"
TIMEOUT_S = 15.0


def _writer(store: Any) -> Any:
    return store.supervisor.ctx.peers["writer"]._actor_weakref()


def _block_completions(store: Any, gate: threading.Event) -> None:
    """Park the completion thread in a done-callback until `gate` is set. A callback added
    to a future already done runs in the adding thread, so retry until one runs there."""
    entered = threading.Event()

    def park(_future: Future[PutResult]) -> None:
        if threading.current_thread().name == COMPLETION_THREAD:
            entered.set()
            gate.wait(TIMEOUT_S)

    while not entered.is_set():
        store.put_async(Message(topic="gate", body=b"g")).add_done_callback(park)
        entered.wait(0.05)


def _read_queue(store: Any, topic: str, queue_id: int) -> list[Any]:
    """Every message of the queue from offset 0 (a get returns at most 32)."""
    out: list[Any] = []
    offset = 0
    while offset < store.max_offset(topic, queue_id):
        got = store.get(topic, queue_id, offset, 32)
        assert got.found, got.status
        out.extend(got.messages)
        offset = got.next_begin_offset
    return out


@pytest.mark.parametrize("flush_disk_type", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_futures_complete_off_the_writer_thread_with_exact_offsets(store_dir: Path, flush_disk_type: str) -> None:
    with helpers.open_small(store_dir, flush_disk_type=flush_disk_type) as store:
        threads: list[str] = []
        futures = []
        for i in range(300):
            future = store.put_async(Message(topic="orders", body=b"m%d" % i, queue_id=i % 3))
            future.add_done_callback(lambda _f: threads.append(threading.current_thread().name))
            futures.append(future)
        done = {f.result(TIMEOUT_S) for f in as_completed(futures, timeout=TIMEOUT_S)}
        assert all(r.ok for r in done)
        # Each queue got consecutive offsets in the order its puts were made.
        for q in range(3):
            assert [futures[i].result().queue_offset for i in range(q, 300, 3)] == list(range(100))
        # Callbacks added while pending run on the completion thread; those added after the
        # future was done run in this thread. Never in an actor's thread.
        assert threads and all(name in (COMPLETION_THREAD, threading.current_thread().name) for name in threads)
        assert COMPLETION_THREAD in threads
        writer_threads = [t.name for t in threading.enumerate() if t.name.startswith("CommitLogWriter")]
        assert writer_threads and not set(writer_threads) & set(threads)
        batch = store.put_batch_async([Message(topic="orders", body=b"b%d" % i, queue_id=1) for i in range(5)])
        result = batch.result(TIMEOUT_S)
        assert result.ok and result.msg_num == 5 and result.queue_offset == 100
        helpers.wait_dispatched(store)
        expected = [b"m%d" % i for i in range(1, 300, 3)] + [b"b%d" % i for i in range(5)]
        assert [m.body for m in _read_queue(store, "orders", 1)] == expected


def test_a_writer_pass_hands_its_answers_to_the_completion_thread_at_once(store_dir: Path) -> None:
    """One wake-up of the completion thread per writer pass, not one per put."""
    with helpers.open_small(store_dir) as store:
        assert store.put_async(Message(topic="orders", body=b"warm")).result(TIMEOUT_S).ok
        sink = store._puts._to_completion
        real = sink._completions
        handed: list[int] = []

        class Counting:
            def put(self, answers: Any) -> None:
                handed.append(len(answers))
                real.put(answers)

        writer = _writer(store)
        passes_before = writer.passes
        sink._completions = Counting()
        try:
            futures = [store.put_async(Message(topic="orders", body=b"p%d" % i, queue_id=i % 2)) for i in range(500)]
            statuses = [f.result(TIMEOUT_S).status for f in futures]
            assert all(s is PutMessageStatus.PUT_OK for s in statuses), set(statuses)
        finally:
            sink._completions = real
        assert sum(handed) == 500
        assert len(handed) == writer.passes - passes_before < 500


def test_a_future_cannot_be_cancelled_and_errors_are_statuses(store_dir: Path) -> None:
    with helpers.open_small(store_dir) as store:
        future = store.put_async(Message(topic="orders", body=b"x"))
        assert not future.cancel()
        assert future.result(TIMEOUT_S).ok
        illegal = store.put_async(Message(topic="bad topic!", body=b"x"))
        assert illegal.done() and illegal.result().status is PutMessageStatus.MESSAGE_ILLEGAL
        with pytest.raises(TypeError):
            store.put_async(Message(topic="orders", body="not bytes"))  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            store.put_batch_async([])
        with pytest.raises(TypeError):
            store.put_async("not a message")  # type: ignore[arg-type]
        assert not store._puts._pending  # nothing handed out for flush() to wait for
    with pytest.raises(StoreClosedError):  # as every call after close()
        store.put_async(Message(topic="orders", body=b"x"))
    with pytest.raises(StoreClosedError):
        store.actor_client(pykka.ActorRef)  # type: ignore[arg-type]


def test_flush_waits_for_every_future_handed_out_before_it(store_dir: Path) -> None:
    with helpers.open_small(store_dir) as store:
        gate = threading.Event()
        _block_completions(store, gate)
        futures = [store.put_async(Message(topic="orders", body=b"f%d" % i)) for i in range(20)]
        flusher = threading.Thread(target=store.flush)
        flusher.start()
        flusher.join(0.3)
        assert flusher.is_alive(), "flush returned while futures handed out before it were pending"
        assert not any(f.done() for f in futures)
        gate.set()
        flusher.join(TIMEOUT_S)
        assert not flusher.is_alive()
        assert all(f.done() and f.result().ok for f in futures)


def test_in_flight_bound_fails_fast_with_os_page_cache_busy(store_dir: Path) -> None:
    with helpers.open_small(store_dir, max_puts_in_flight=2, put_fail_fast_when_in_flight_full=True) as store:
        gate = threading.Event()
        _block_completions(store, gate)
        held = [store.put_async(Message(topic="orders", body=b"h%d" % i)) for i in range(2)]
        refused = store.put_async(Message(topic="orders", body=b"over"))
        assert refused.done()
        assert refused.result().status is PutMessageStatus.OS_PAGE_CACHE_BUSY
        gate.set()
        assert all(f.result(TIMEOUT_S).ok for f in held)
        assert store.put_async(Message(topic="orders", body=b"again")).result(TIMEOUT_S).ok
        helpers.wait_dispatched(store)
        bodies = [m.body for m in _read_queue(store, "orders", 0)]
        assert b"over" not in bodies and bodies[-1] == b"again"


def test_in_flight_bound_blocks_until_an_answer_frees_a_slot(store_dir: Path) -> None:
    with helpers.open_small(store_dir, max_puts_in_flight=2) as store:
        gate = threading.Event()
        _block_completions(store, gate)
        held = [store.put_async(Message(topic="orders", body=b"h%d" % i)) for i in range(2)]
        third: list[Future[PutResult]] = []
        putter = threading.Thread(target=lambda: third.append(store.put_async(Message(topic="orders", body=b"3"))))
        putter.start()
        putter.join(0.3)
        assert putter.is_alive() and not third, "put_async did not block at max_puts_in_flight"
        gate.set()
        putter.join(TIMEOUT_S)
        assert not putter.is_alive()
        assert all(f.result(TIMEOUT_S).ok for f in held) and third[0].result(TIMEOUT_S).ok


def test_concurrent_producers_get_exact_per_queue_offsets_in_their_order(store_dir: Path) -> None:
    per_thread = 400
    with helpers.open_small(store_dir, mapped_file_size_commitlog_bytes=1 << 20) as store:
        results: dict[int, list[tuple[int, Future[PutResult]]]] = {}

        def produce(t: int) -> None:
            mine = []
            for i in range(per_thread):
                q = i % 2
                mine.append((q, store.put_async(Message(topic="orders", body=b"%d-%d" % (t, i), queue_id=q))))
                if i % 50 == 0:
                    store.put(Message(topic="orders", body=b"%d-%d-sync" % (t, i), queue_id=q))
            results[t] = mine

        producers = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for p in producers:
            p.start()
        for p in producers:
            p.join(TIMEOUT_S * 4)
        all_futures = [f for mine in results.values() for _q, f in mine]
        assert not wait(all_futures, timeout=TIMEOUT_S).not_done
        offsets: dict[int, list[int]] = defaultdict(list)
        for mine in results.values():
            last = {0: -1, 1: -1}
            for q, future in mine:
                r = future.result()
                assert r.ok
                assert r.queue_offset > last[q], "a thread's puts to one queue out of order"
                last[q] = r.queue_offset
                offsets[q].append(r.queue_offset)
        helpers.wait_dispatched(store)
        for q in (0, 1):
            total = store.max_offset("orders", q)
            synced = 4 * (per_thread // 50) if q == 0 else 0  # i % 50 == 0 is even: queue 0
            assert total == 4 * per_thread // 2 + synced
            assert len(set(offsets[q])) == len(offsets[q])
            seen = {m.queue_offset: m.body for m in _read_queue(store, "orders", q)}
            assert sorted(seen) == list(range(total))
        writer = _writer(store)
        assert writer.passed_puts >= 4 * per_thread and writer.passes <= writer.passed_puts


def test_writer_crash_mid_pass_completes_every_pending_future(store_dir: Path) -> None:
    plan = FaultPlan()
    with helpers.open_small(store_dir, faults=plan) as store:
        assert store.put(Message(topic="orders", body=b"warm")).ok
        plan.arm("writer.after_append", 1)
        futures = [store.put_async(Message(topic="orders", body=b"c%d" % i, keys=["c%d" % i])) for i in range(200)]
        done, not_done = wait(futures, timeout=TIMEOUT_S)
        assert not not_done, "a future hung after the writer crashed"
        statuses = [f.result().status for f in futures]
        assert PutMessageStatus.SERVICE_NOT_AVAILABLE in statuses
        assert set(statuses) <= {PutMessageStatus.PUT_OK, PutMessageStatus.SERVICE_NOT_AVAILABLE}
        helpers.wait_until(lambda: store.put(Message(topic="orders", body=b"after")).ok, what="writer restarted")
        helpers.wait_dispatched(store)
        for i, f in enumerate(futures):
            if f.result().ok:  # every acknowledged put is there, once
                assert len(store.query("orders", "c%d" % i).messages) == 1


class _WindowedProducer(pykka.ThreadingActor):
    """Keeps `window` single puts in flight through the actor client."""

    def __init__(self, store: Any, total: int, window: int, done: threading.Event) -> None:
        super().__init__()
        self.store, self.total, self.window, self.done = store, total, window, done
        self.sent = 0
        self.results: dict[int, PutResult] = {}
        self.threads: set[str] = set()

    def on_start(self) -> None:
        self.client = self.store.actor_client(self.actor_ref)
        for _ in range(self.window):
            self._send()

    def _send(self) -> None:
        if self.sent < self.total:
            self.client.put(Message(topic="actors", body=b"a%d" % self.sent), correlation_id=self.sent)
            self.sent += 1

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Replied):
            self.threads.add(threading.current_thread().name)
            self.results[message.correlation_id] = message.answer
            if len(self.results) == self.total:
                self.done.set()
            self._send()
        elif message == "results":
            return dict(self.results)
        return None


def test_actor_client_window_batch_and_fire_and_forget(store_dir: Path) -> None:
    with helpers.open_small(store_dir) as store:
        done = threading.Event()
        producer = _WindowedProducer.start(store, 300, 16, done)
        try:
            assert done.wait(TIMEOUT_S)
            results: dict[int, PutResult] = producer.ask("results")
        finally:
            producer.stop()
        assert sorted(results) == list(range(300))
        assert [results[i].queue_offset for i in range(300)] == list(range(300))
        assert all(r.ok for r in results.values())

        class Sink(pykka.ThreadingActor):
            def __init__(self) -> None:
                super().__init__()
                self.got: list[Any] = []

            def on_receive(self, message: Any) -> Any:
                if isinstance(message, Replied):
                    self.got.append(message)
                    return None
                return list(self.got)

        sink = Sink.start()
        try:
            client = store.actor_client(sink)
            assert client.put_batch([Message(topic="actors", body=b"b%d" % i) for i in range(4)], correlation_id="b")
            assert not client.put(Message(topic="bad topic!", body=b"x"), correlation_id="bad")
            assert client.put_and_forget(Message(topic="actors", body=b"forgotten"))
            helpers.wait_until(lambda: len(sink.ask("list")) == 2, what="two replies")
            replies = {r.correlation_id: r.answer for r in sink.ask("list")}
            assert replies["b"].ok and replies["b"].msg_num == 4 and replies["b"].queue_offset == 300
            assert replies["bad"].status is PutMessageStatus.MESSAGE_ILLEGAL
            helpers.wait_dispatched(store)
            assert store.max_offset("actors", 0) == 305
            assert store.get("actors", 0, 304, 1).messages[0].body == b"forgotten"
        finally:
            sink.stop()
        with pytest.raises(TypeError):
            store.actor_client("not a ref")  # type: ignore[arg-type]


def test_a_notice_that_found_reput_restarting_is_told_again_on_the_next_tick(store_dir: Path) -> None:
    """Reput learns the log end from the writer's Ping when it starts, and is a peer only after
    its handshake: a put appended in between was told to nobody (seen with put_async streams
    across a writer crash) and stayed undispatched until another put came."""
    with helpers.open_small(store_dir) as store:
        assert store.put(Message(topic="orders", body=b"before")).ok
        helpers.wait_dispatched(store)
        peers = store.supervisor.ctx.peers
        reput = peers.pop("reput")  # the window between reput's start Ping and its registration
        try:
            assert store.put(Message(topic="orders", body=b"unheard")).ok
        finally:
            peers["reput"] = reput
        helpers.wait_dispatched(store)  # the writer's tick (flush_interval_commitlog_ms) tells it
        assert [m.body for m in store.get("orders", 0, 0, 10).messages] == [b"before", b"unheard"]


def test_a_failed_fire_and_forget_put_goes_to_the_stats(store_dir: Path) -> None:
    from mqstore.messages import SetWriteable

    with helpers.open_small(store_dir) as store:

        class Quiet(pykka.ThreadingActor):
            pass

        ref = Quiet.start()
        try:
            client = store.actor_client(ref)
            assert not client.put_and_forget(Message(topic="bad topic!", body=b"x"))  # refused here
            assert store.stats()["put_message_status_times"] == {"MESSAGE_ILLEGAL": 1}  # (review 44 L1)
            store.supervisor.ctx.peers["writer"].ask(SetWriteable(writeable=False))
            assert client.put_and_forget(Message(topic="orders", body=b"refused by the writer"))
            helpers.wait_until(lambda: store.stats()["put_message_failed_times"] == 2, what="the failure counted")
            assert store.stats()["put_message_status_times"] == {"MESSAGE_ILLEGAL": 1, "SERVICE_NOT_AVAILABLE": 1}
        finally:
            ref.stop()


def _lines(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [r.mqstore_event for r in caplog.records if r.getMessage() == event]


def test_a_fire_and_forget_put_refused_in_a_loop_is_logged_once_a_minute_and_each_counted(
    store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review 58 F4: one caller refused again and again logged a line each time (13k lines/s).
    The first is logged in full, then a line a minute (the store's ticker) with how many were
    not; the stats count every one, and the close counts the last ones."""
    ticker = ManualTicker(sleeps_move_time=False)  # only the test's advances count its minute
    with caplog.at_level(logging.WARNING, logger="mqstore"), helpers.open_small(store_dir, ticker=ticker) as store:

        class Quiet(pykka.ThreadingActor):
            pass

        ref = Quiet.start()
        try:
            client = store.actor_client(ref)
            bad = Message(topic="bad topic!", body=b"x")
            assert not any(client.put_and_forget(bad) for _ in range(500))
            (first,) = _lines(caplog, "fire-and-forget put refused")
            assert first["topic"] == "bad topic!" and first["status"] == "MESSAGE_ILLEGAL" and "suppressed" not in first
            ticker.advance(REPEAT_LOG_INTERVAL_MS - 1)
            assert not client.put_and_forget(bad)
            assert len(_lines(caplog, "fire-and-forget put refused")) == 1
            ticker.advance(1)
            assert not any(client.put_and_forget(bad) for _ in range(8))
            assert [line.get("suppressed") for line in _lines(caplog, "fire-and-forget put refused")] == [None, 500]
            # Another topic's refusal of the same status is news (review 59 L2).
            assert not client.put_and_forget(Message(topic="other topic!", body=b"x"))
            assert [line["topic"] for line in _lines(caplog, "fire-and-forget put refused")] == ["bad topic!"] * 2 + ["other topic!"]
            assert store.stats()["put_message_status_times"] == {"MESSAGE_ILLEGAL": 510}
        finally:
            ref.stop()
    assert _lines(caplog, "repeats not logged") == [{"store": str(store_dir), "kind": "fire-and-forget put refused / MESSAGE_ILLEGAL / bad topic!",
                                                     "suppressed": 7}]  # fmt: skip


def test_a_done_callback_that_raises_at_every_put_is_logged_once_a_minute(
    store_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review 58 F4: a raising done-callback logged a line per put (16k lines/s)."""
    ticker = ManualTicker()

    def raises(_future: Future[PutResult]) -> None:
        raise ValueError("host bug")

    def put_with_callbacks(n: int) -> None:
        gate, ran = threading.Event(), threading.Event()
        _block_completions(store, gate)  # the callbacks are added before their futures are done
        for _ in range(n):
            store.put_async(Message(topic="orders", body=b"x")).add_done_callback(raises)
        store.put_async(Message(topic="orders", body=b"last")).add_done_callback(lambda _f: ran.set())
        gate.set()
        assert ran.wait(TIMEOUT_S)  # done-callbacks run in completion order: every one ran

    with caplog.at_level(logging.ERROR, logger="mqstore"), helpers.open_small(store_dir, ticker=ticker) as store:
        put_with_callbacks(100)
        (first,) = _lines(caplog, "a put's done-callback raised")
        assert first["error"] == "ValueError('host bug')" and "suppressed" not in first
        ticker.advance(REPEAT_LOG_INTERVAL_MS)
        put_with_callbacks(1)
        assert [line.get("suppressed") for line in _lines(caplog, "a put's done-callback raised")] == [None, 99]


def test_an_answer_that_cannot_be_delivered_does_not_crash_the_writer(store_dir: Path) -> None:
    from mqstore import Reply
    from mqstore.messages import Put

    with helpers.open_small(store_dir) as store:

        def broken(_answer: Any) -> None:
            raise RuntimeError("the host's callback is broken")

        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        store.actor_ref.tell(Put(messages=(Message(topic="orders", body=b"a"),), reply=Reply(callback=broken)))
        store.actor_ref.tell(Put(messages=(Message(topic="orders", body=b"b"),), reply=Reply(future=future)))
        assert future.get(timeout=TIMEOUT_S).ok
        assert store.put(Message(topic="orders", body=b"c")).ok
        assert store.supervisor.restarts == []


def test_a_thread_reads_its_own_put_async_once_it_saw_it_done(store_dir: Path) -> None:
    with helpers.open_small(store_dir, mapped_file_size_commitlog_bytes=1 << 20) as store:
        for i in range(50):
            result = store.put_async(Message(topic="ryw", body=b"r%d" % i)).result(TIMEOUT_S)
            assert result.ok
            got = store.get("ryw", 0, result.queue_offset, 1)  # no wait: the read contract waits
            assert got.found and got.messages[0].body == b"r%d" % i
            assert store.max_offset("ryw", 0) == i + 1


def test_a_thread_reads_every_put_async_it_saw_done_when_a_pass_reorders_them(store_dir: Path) -> None:
    """One writer pass appends queue by queue, so of three futures (queues 1, 0, 1) the queue-0
    put may lie after the newest in the log; the reads waited for the newest put's record only
    and missed the older one (found by tests/test_model_store.py). Timing decides how often a
    pass takes the three together: about a tenth of trials did, so 300 trials catch it."""
    body = bytes(12_000)
    with helpers.open_small(store_dir, mapped_file_size_commitlog_bytes=64 * 1024) as store:
        counts = {0: 0, 1: 0}
        for trial in range(300):
            futures = [store.put_async(Message(topic="ryw", queue_id=q, body=body)) for q in (1, 0, 1)]
            assert all(f.result(TIMEOUT_S).ok for f in futures)
            counts[0] += 1
            counts[1] += 2
            if trial % 2:
                assert store.max_offset("ryw", 0) == counts[0], trial
            else:
                got = store.get("ryw", 0, counts[0] - 1, 1)
                assert got.found and got.messages[0].queue_offset == counts[0] - 1, (trial, got)


def test_flush_from_a_done_callback_does_not_wait_for_its_own_thread(store_dir: Path) -> None:
    with helpers.open_small(store_dir) as store:
        entered, flushed = threading.Event(), threading.Event()

        def flush_then_signal(_future: Future[PutResult]) -> None:
            if threading.current_thread().name == COMPLETION_THREAD and not entered.is_set():
                entered.set()
                store.flush()  # would wait (20 s) for the futures this thread has to complete
                flushed.set()

        while not entered.is_set():  # until one callback runs on the completion thread
            store.put_async(Message(topic="orders", body=b"x")).add_done_callback(flush_then_signal)
            store.put_async(Message(topic="orders", body=b"y"))  # pending behind it
            entered.wait(0.05)
        assert flushed.wait(10), "flush in a done-callback waited for its own thread"


def test_a_done_callback_that_waits_on_another_put_async_future_gets_its_result(store_dir: Path) -> None:
    """Only the completion thread completes futures, and done-callbacks run on it: a callback
    that waited on another put's future waited on itself. Without a timeout the host hung for
    good. Now result() on that thread completes the passes queued behind it while it waits."""
    with helpers.open_small(store_dir) as store:
        entered, answered = threading.Event(), threading.Event()
        inner: list[PutResult] = []

        def put_and_wait(_future: Future[PutResult]) -> None:
            if threading.current_thread().name == COMPLETION_THREAD and not entered.is_set():
                entered.set()
                following = store.put_async(Message(topic="orders", body=b"inner"))
                inner.append(following.result(timeout=10))
                assert following.exception(timeout=0) is None
                answered.set()

        while not entered.is_set():  # until one callback runs on the completion thread
            store.put_async(Message(topic="orders", body=b"outer")).add_done_callback(put_and_wait)
            entered.wait(0.05)
        assert answered.wait(15), "a done-callback waiting on another put's future never got its result"
        assert inner[0].ok
        # Put from the completion thread, not this one: this thread reads it once dispatched.
        assert store.wait_for_messages("orders", 0, inner[0].queue_offset, 10)
        got = store.get("orders", 0, inner[0].queue_offset, 1)
        assert got.found and got.messages[0].body == b"inner"


def test_every_in_flight_slot_comes_back_once_its_answer_is_delivered(store_dir: Path) -> None:
    """Slots are given back per writer pass (futures on the completion thread, actor answers
    on the writer's): after a burst of both, exactly the configured number is free again."""
    with helpers.open_small(store_dir, max_puts_in_flight=64) as store:
        pipeline = store._puts
        futures = [store.put_async(Message(topic="slots", body=b"f%d" % i, queue_id=i % 3)) for i in range(300)]
        done = threading.Event()
        producer = _WindowedProducer.start(store, 300, 16, done)
        try:
            assert done.wait(TIMEOUT_S)
        finally:
            producer.stop()
        assert all(f.result(TIMEOUT_S).ok for f in futures)
        store.flush()
        helpers.wait_until(lambda: pipeline._free_slots == 64, what="every slot back")
        assert pipeline._free_slots == 64 and not pipeline._pending


@pytest.mark.parametrize("native", [True, False])
def test_in_flight_slots_take_give_and_wake_a_blocked_taker(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound itself, on the C semaphore and on the lock-and-condition fallback."""
    from mqstore.put_pipeline import _InFlightSlots
    from mqstore.storage import speedups

    if native and speedups.native is None:
        pytest.skip("C extension not built")
    if not native:
        monkeypatch.setattr(speedups, "native", None)
    slots = _InFlightSlots(2)
    assert slots.free == 2
    assert slots.take(None, []) and slots.take(None, [])
    assert not slots.take(None, []) and slots.free == 0  # full: refused at once
    started = time.monotonic()
    assert not slots.take(0.05, [])  # full: waited, then refused
    assert time.monotonic() - started >= 0.04
    taken = threading.Event()
    taker = threading.Thread(target=lambda: slots.take(TIMEOUT_S, []) and taken.set())
    taker.start()
    assert not taken.wait(0.05)
    slots.give(1)
    taker.join(TIMEOUT_S)
    assert taken.is_set() and slots.free == 0
    slots.give(2)
    assert slots.free == 2


class _FastWindowedProducer(_WindowedProducer, RuntimeActor):
    """_WindowedProducer on the store's runtime inbox, where a writer pass tells each sender
    all its answers at once (tell_all_keeping_gil); it notes the order answers arrive in."""

    def __init__(self, store: Any, total: int, window: int, done: threading.Event) -> None:
        super().__init__(store, total, window, done)
        self.arrivals: list[int] = []

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Replied):
            self.arrivals.append(message.correlation_id)
        elif message == "arrivals":
            return list(self.arrivals)
        return super().on_receive(message)


def test_a_pass_answers_each_runtime_actor_once_per_put_in_its_order(store_dir: Path) -> None:
    with helpers.open_small(store_dir) as store:
        dones = [threading.Event() for _ in range(3)]
        producers = [_FastWindowedProducer.start(store, 200, 32, done) for done in dones]
        try:
            assert all(done.wait(TIMEOUT_S) for done in dones)
            results: list[dict[int, PutResult]] = [p.ask("results") for p in producers]
            arrivals: list[list[int]] = [p.ask("arrivals") for p in producers]
            # Read-your-writes: each sender's noted end is that of its furthest stored put.
            for p, got in zip(producers, results):
                assert store._puts.actor_put_end(p) == max(r.commitlog_offset + r.wrote_bytes for r in got.values())
        finally:
            for p in producers:
                p.stop()
        offsets: list[int] = []
        for got, arrived in zip(results, arrivals):
            assert sorted(got) == list(range(200)) and all(r.ok for r in got.values())
            assert arrived == list(range(200))  # each answer once, in the order of the puts
            mine = [got[i].queue_offset for i in range(200)]
            assert mine == sorted(mine)  # one sender's puts to a queue keep their order
            offsets += mine
        assert sorted(offsets) == list(range(600))  # and no offset given twice
        assert store._puts._free_slots == store.config.max_puts_in_flight


def test_the_writer_builds_replied_through_its_slots_as_the_same_value() -> None:
    """put_pipeline._replied skips the frozen dataclass's __init__ (per put, on the writer's
    thread): what the sender gets is equal to, hashes and matches as a constructed Replied."""
    result = PutResult(status=PutMessageStatus.PUT_OK, commitlog_offset=7)
    built = put_pipeline._replied(("put", 3), result)
    assert type(built) is Replied and built == Replied(correlation_id=("put", 3), answer=result)
    assert hash(built) == hash(Replied(correlation_id=("put", 3), answer=result))
    match built:
        case Replied(correlation_id=("put", n), answer=answer):
            assert n == 3 and answer is result
        case _:
            pytest.fail("not matched as a Replied")


def test_a_put_future_makes_its_condition_only_for_those_who_wait_and_never_misses_them() -> None:
    """_PutFuture builds its threading.Condition on first use (most futures are only polled or
    completed: the Condition was 2.5 us of put_async's caller): completing one nobody waits on
    takes no condition, and a waiter (result, wait, as_completed, a callback) racing the
    completion from another thread is always woken, with the one result."""
    lone = put_pipeline._PutFuture()
    ok = PutResult(status=PutMessageStatus.PUT_OK)
    assert not lone.done() and lone.running() and not lone.cancel()
    lone.set_result(ok)
    assert lone._cond is None and lone.done() and not lone.running() and lone.result(0) is ok
    with pytest.raises(InvalidStateError):
        lone.set_result(ok)  # a second answer (the close racing the completion thread) is refused
    for round_ in range(300):
        futures = [put_pipeline._PutFuture() for _ in range(4)]
        called: list[Any] = []
        futures[3].add_done_callback(called.append)
        go = threading.Barrier(2)

        def complete() -> None:
            go.wait()
            for f in futures:
                f.set_result(ok)

        setter = threading.Thread(target=complete)
        setter.start()
        go.wait()
        if round_ % 3 == 0:
            assert futures[0].result(TIMEOUT_S) is ok
        elif round_ % 3 == 1:
            assert not wait(futures[:3], timeout=TIMEOUT_S).not_done
        else:
            assert len(list(as_completed(futures[:3], timeout=TIMEOUT_S))) == 3
        setter.join(TIMEOUT_S)
        assert all(f.done() and f.result(0) is ok for f in futures) and called == [futures[3]]


def test_a_passes_futures_are_all_done_before_any_of_its_done_callbacks_runs() -> None:
    """A callback of a pass's first future that waits on a later future of the same pass (one
    with a Condition: a callback or a waiter of its own) waited for good: that future was
    completed only after the first one's callbacks returned. Now the pass's results are all
    set first, then the callbacks run."""
    first, second = put_pipeline._PutFuture(), put_pipeline._PutFuture()
    ok = PutResult(status=PutMessageStatus.PUT_OK)
    seen: list[bool] = []
    first.add_done_callback(lambda _f: seen.append(second.done() and second.result(0) is ok))
    second.add_done_callback(lambda _f: None)
    due = put_pipeline._complete_futures([(first, ok), (second, ok)], [])
    assert due == [first, second] and seen == []  # the caller runs them, once all are set
    for future in due:
        future._invoke_callbacks()  # type: ignore[attr-defined]
    assert seen == [True]


def test_done_callbacks_that_each_put_and_wait_do_not_nest_and_every_future_is_answered(store_dir: Path) -> None:
    """Every put's callback puts a follow-up and waits on it, under two producers. A wait that
    ran the callbacks of the passes it completed nested without bound (110 deep in the review's
    run), until RecursionError abandoned passes taken off the queue: their stored puts were
    answered "store closed" at close(). Callbacks now run one at a time, from the loop. And
    the callbacks waiting to run stay within the in-flight bound: a second review saw 458k
    queued in 14 s when the passes a wait completed gave their slots back at once. A follow-up
    put that finds every slot taken is refused OS_PAGE_CACHE_BUSY (the completion thread never
    blocks on a slot)."""
    in_flight = 256
    with helpers.open_small(store_dir, max_puts_in_flight=in_flight) as store:
        most_due = [0]
        depth, deepest, errors = [0], [0], []
        follow_ups: list[Future[PutResult]] = []
        outer: list[Future[PutResult]] = []
        stop = threading.Event()

        def put_and_wait(_future: Future[PutResult]) -> None:
            if threading.current_thread().name != COMPLETION_THREAD:
                return
            depth[0] += 1
            deepest[0] = max(deepest[0], depth[0])
            most_due[0] = max(most_due[0], len(store._puts._callbacks_due))
            try:
                following = store.put_async(Message(topic="audit", body=b"a"))
                follow_ups.append(following)
                following.result(timeout=TIMEOUT_S)
            except BaseException as exc:  # noqa: BLE001 - what the callback met is the finding
                errors.append(exc)
            finally:
                depth[0] -= 1

        def produce() -> None:
            while not stop.is_set() and len(outer) < 20_000:
                future = store.put_async(Message(topic="orders", body=b"o"))
                future.add_done_callback(put_and_wait)
                outer.append(future)

        producers = [threading.Thread(target=produce) for _ in range(2)]
        for producer in producers:
            producer.start()
        time.sleep(1.5)
        stop.set()
        for producer in producers:
            producer.join()
        store.flush()

        def settled() -> bool:  # callbacks still queued put more follow-ups
            return not store._puts._callbacks_due and depth[0] == 0 and all(f.done() for f in outer + follow_ups)

        helpers.wait_until(settled, TIMEOUT_S, "every callback run and every future done")
        every = outer + follow_ups
        assert errors == [] and deepest[0] == 1, (errors[:3], deepest[0])
        # Held slots bound the callbacks of passes completed by waits; one pass more is the loop's own.
        from mqstore.actors.commitlog_writer import PASS_MAX_PUTS

        assert most_due[0] <= in_flight + PASS_MAX_PUTS, most_due[0]
        not_done = [f for f in every if not f.done()]
        assert not not_done, f"{len(not_done)} of {len(every)} futures not done"
        assert all(f.result(0).ok for f in outer), {f.result(0).status for f in outer}
        refused = [f.result(0).status for f in follow_ups if not f.result(0).ok]
        assert set(refused) <= {PutMessageStatus.OS_PAGE_CACHE_BUSY}
        assert len(refused) < len(follow_ups)


def _in_a_done_callback_of(store: Any, action: Callable[[], None]) -> None:
    """Run `action` once, in a done-callback of one of `store`'s puts on its completion thread
    (puts are made until one's callback runs there: one done before the callback was added
    runs it in this thread); returns once it has begun."""
    entered = threading.Event()

    def callback(_future: Future[PutResult]) -> None:
        if threading.current_thread().name == COMPLETION_THREAD and not entered.is_set():
            entered.set()
            action()

    while not entered.is_set():
        store.put_async(Message(topic="orders", body=b"a")).add_done_callback(callback)
        entered.wait(0.05)


def test_a_done_callback_waiting_on_another_stores_future_sees_it_done(tmp_path: Path) -> None:
    """The wait on the completion thread completes this store's queued passes; a future that
    another store completes (or close() does) must end the wait too, with nothing more queued
    here. Before, the wait slept on this store's queue until its timeout."""
    with helpers.open_small(tmp_path / "a") as a, helpers.open_small(tmp_path / "b") as b:
        hold_b = threading.Event()
        _block_completions(b, hold_b)  # b's next future stays pending until hold_b is set
        elsewhere = b.put_async(Message(topic="orders", body=b"b"))
        outcome: list[Any] = []

        def wait_on_b() -> None:
            started = time.monotonic()
            outcome.append(elsewhere.result(timeout=TIMEOUT_S))
            outcome.append(time.monotonic() - started)

        _in_a_done_callback_of(a, wait_on_b)
        assert not elsewhere.done()
        time.sleep(0.3)
        hold_b.set()
        deadline = time.monotonic() + TIMEOUT_S + 5
        while len(outcome) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(outcome) == 2 and outcome[0].ok, outcome
        assert outcome[1] < 3.0, f"waited {outcome[1]:.1f} s for a future done after 0.3 s"


def test_a_done_callbacks_wait_with_a_timeout_times_out_once(tmp_path: Path) -> None:
    """result(timeout=T) on the completion thread: the passes completed while waiting and the
    wait after them share T. Before, each had its own: a TimeoutError came after 2T."""
    with helpers.open_small(tmp_path / "a") as a, helpers.open_small(tmp_path / "b") as b:
        hold_b = threading.Event()
        _block_completions(b, hold_b)
        never_in_time = b.put_async(Message(topic="orders", body=b"b"))
        outcome: list[Any] = []

        def wait_a_second() -> None:
            started = time.monotonic()
            try:
                never_in_time.result(timeout=1.0)
            except TimeoutError:
                outcome.append(time.monotonic() - started)

        _in_a_done_callback_of(a, wait_a_second)
        deadline = time.monotonic() + TIMEOUT_S
        while not outcome and time.monotonic() < deadline:
            time.sleep(0.01)
        hold_b.set()
        assert outcome and 0.9 <= outcome[0] < 1.6, outcome


def test_close_from_a_done_callback_lets_the_completion_thread_end(store_dir: Path) -> None:
    """close() from a done-callback completes what is queued there, stop marker included: the
    thread went back to waiting on an empty queue for good (a thread leaked per such store)."""
    store = helpers.open_small(store_dir)
    entered, closed = threading.Event(), threading.Event()

    def close_store(_future: Future[PutResult]) -> None:
        if threading.current_thread().name == COMPLETION_THREAD and not entered.is_set():
            entered.set()
            store.close()
            closed.set()

    while not entered.is_set():
        store.put_async(Message(topic="orders", body=b"x")).add_done_callback(close_store)
        entered.wait(0.05)
    assert closed.wait(TIMEOUT_S)
    thread = store._puts._thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive(), "the completion thread outlived its store"


def test_a_done_callback_raising_system_exit_does_not_stop_the_completions(store_dir: Path) -> None:
    """Future logs a callback's Exception; a BaseException such as SystemExit ended the
    completion thread, and every later future stayed pending for good. (Future's own
    _invoke_callbacks also stopped there: the same future's next callback never ran.)"""
    with helpers.open_small(store_dir) as store:
        entered = threading.Event()
        next_ran: list[Future[PutResult]] = []
        raised_on: list[Future[PutResult]] = []

        def leave(future: Future[PutResult]) -> None:
            if threading.current_thread().name == COMPLETION_THREAD and not entered.is_set():
                entered.set()
                raised_on.append(future)
                raise SystemExit("a callback's bad day")

        while not entered.is_set():
            future = store.put_async(Message(topic="orders", body=b"x"))
            future.add_done_callback(leave)
            future.add_done_callback(next_ran.append)
            entered.wait(0.05)
        after = store.put_async(Message(topic="orders", body=b"after"))
        assert after.result(timeout=TIMEOUT_S).ok
        helpers.wait_until(lambda: raised_on[0] in next_ran, TIMEOUT_S, "the next callback of that future")


@pytest.mark.parametrize(
    "settings",
    [{}, {"transient_store_pool_enable": True, "transient_store_pool_size": 2}, {"faults": FaultPlan()}],
    ids=["fast-append", "write-buffers", "checked-path"],
)
def test_single_puts_land_where_they_would_one_by_one_however_they_met_in_the_inbox(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    """put_async's singles of one queue are appended as runs. A run that met a segment's end
    rolled over whole, leaving blank the room its first records fit, so where singles landed
    depended on how many one pass took; a run the fast append declines is split where the
    segment ends (the part that fits as one append, the rest put by put), on every path."""
    messages = [Message(topic="U", body=b"u" * (100 + 97 * k % 4000), queue_id=1) for k in range(400)]
    placed: dict[str, list[tuple[int, int]]] = {}
    for way in ("one by one", "pipelined"):
        with helpers.open_small(tmp_path / way.replace(" ", "-"), clock_ms=lambda: 1_700_000_000_000, **settings) as store:
            if way == "one by one":
                results = [store.put(m) for m in messages]
            else:  # 400 in flight: the writer's passes take up to 256 of them as runs
                results = [f.result(TIMEOUT_S) for f in [store.put_async(m) for m in messages]]
            assert all(r.ok for r in results)
            placed[way] = [(r.commitlog_offset, r.queue_offset) for r in results]
    assert len({offset // (64 * 1024) for offset, _ in placed["one by one"]}) > 10  # many segment ends met
    assert placed["pipelined"] == placed["one by one"]


def test_a_thread_reads_a_put_async_it_saw_stored_whatever_its_newest_put_does(store_dir: Path) -> None:
    """Read-your-writes followed the thread's newest future only: when that one was refused by
    the writer, or was still in flight, the put the thread had seen stored was not covered and
    a read could miss it (review 69 F4). Now every result the thread takes counts."""
    with helpers.open_small(store_dir, mapped_file_size_commitlog_bytes=64 * 1024) as store:
        for trial in range(100):
            seen = store.put_async(Message(topic="seen", body=bytes(12_000))).result(TIMEOUT_S)
            assert seen.ok
            if trial % 2:  # the newest refused by the writer: a record longer than a segment
                newest = store.put_async(Message(topic="seen", queue_id=1, body=bytes(70_000)))
                assert not newest.result(TIMEOUT_S).ok
            else:  # the newest still in flight (or done: then it covers the older one too)
                store.put_async(Message(topic="seen", queue_id=1, body=bytes(12_000)))
            assert store.max_offset("seen", 0) == trial + 1, trial
        store.flush()


def test_a_failure_after_a_pass_handed_out_its_answers_answers_no_put_twice(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 115 F4: the writer failing after its pass handed the answers to their sinks (its
    notice to reput raising, standing for any failure there) answered the pass's first put a
    second time, SERVICE_NOT_AVAILABLE after PUT_OK: an actor client that retries on it stored
    the message twice, and the stats counted it twice."""
    from mqstore.actors import commitlog_writer

    notify = commitlog_writer.CommitLogWriter._notify_advance
    armed = threading.Event()

    def failing_once(self: Any) -> None:
        if armed.is_set() and self._pending_advance is not None:
            armed.clear()
            self._pending_advance = None
            raise MemoryError("a failure at the end of a writer pass")
        notify(self)

    monkeypatch.setattr(commitlog_writer.CommitLogWriter, "_notify_advance", failing_once)
    answers: list[Any] = []
    got = threading.Event()

    class Client(pykka.ThreadingActor):
        def on_receive(self, message: Any) -> Any:
            if isinstance(message, Replied):
                answers.append(message)
                got.set()
            return None

    with helpers.open_small(store_dir) as store:
        client_ref = Client.start()
        try:
            client = store.actor_client(client_ref)
            armed.set()
            client.put(Message(topic="D", body=b"one"), correlation_id="the-put")
            assert got.wait(TIMEOUT_S)
            deadline = time.monotonic() + TIMEOUT_S
            while not store.put(Message(topic="D", body=b"after the restart")).ok:  # the writer restarted
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.5)  # a second answer would be here by now
            assert [(a.correlation_id, a.answer.status) for a in answers] == [("the-put", PutMessageStatus.PUT_OK)]
        finally:
            client_ref.stop()
