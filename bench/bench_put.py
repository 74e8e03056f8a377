"""Put-side benchmark of issue 16 (not in CI): every way of putting, each timed until the last
message is visible through get, beside a same-run floor (the same load on a do-nothing actor:
the hand-offs between threads without the store's work) and the ratio to it.

    .venv/bin/python -m mqstore.bench.bench_put [--quick] [--json out.json]

Cases (1 KiB bodies unless said): put_async from one thread with at most 1,024 in flight; 4
producer actors putting single messages through the actor client with a window of 32; put
from 4 and from 16 threads; put_batch of 32 from one thread at 1 KiB and 128 B; and the
put-to-visible lag (p50/p99) with put_async paced at half the rate put_async reached.
On a shared machine the absolute figures move with the neighbours' load; the ratio to the
floor measured in the same run moves much less. Each row also prints issue 16's target and the
fraction of it reached.

What the profile shows where a target is not met (per-thread CPU from /proc/<tid>/schedstat,
2-vCPU VM shared with other sessions, Nov 2026): the store's Python runs under one GIL, so a
rate is at most one core over the CPU that all its threads spend per message. put_async from
one thread (1 KiB with a key; per-thread CPU, medians of 5 runs alternated with the code before,
2026-11-24, load ~2): the caller 3.8 us a put, was 6.5 (~0.7 of it is the benchmark's own
loop and Message()). One C call (_native.PutSubmitter.submit, 0.66 us on its own) encodes the
message (its CRC by the read path's carry-less-multiply kernel, no longer a call to zlib),
takes the in-flight slot and appends the writer's EncodedPut to its inbox; the rest is the
future and its reply (~0.35), the state checks and ~0.5 of garbage collection. The writer 2.0
(its fast append), the completion thread 1.2 (a pass's futures completed under one lock),
reput, index and ConsumeQueue ~1.4, flush 0.6-2 (mostly msync, without the GIL). Same runs:
91k -> 125k msgs/s at 1 KiB, 108k -> 150k at 128 B; this bench's rows (until visible, medians
of 3 --quick runs alternated) put_async 91k -> 116k, 4 actors 67k -> 84k, put_batch 32 of
1 KiB 145k -> 153k. The lag case is paced at half of the put_async rate of its own run, so it
now runs faster (~58k/s): at one rate both codes were measured alike or better after (p99
5.4-6.9 ms against 6.8-57 at 45k/s; 19-73 against 77-107 at 58k/s). The floor pays only the
Future, one inbox hop and the completion thread. put from 4 threads (session 8, idle): ~84 us
of CPU per put across all threads, 15-16k msgs/s against a floor of ~100k: each put is a round
trip with two cross-vCPU wake-ups, a writer pass (15-20 us a put after the fast append, most
of it kernel switching) and reput, ConsumeQueue, index and flush woken per pass; the whole
process on one CPU runs it ~2x faster (README, one-CPU table). put_batch of 32 at 128 B: a
round trip per batch costs ~130 us (writer pass ~35, the caller's wake-up and encoding ~50).
Two measurements join the rows (session 12): `put 4 threads, 1 CPU`, the same case with every
thread of the process on one CPU (18-22k against 11-13k on two, same runs), and the CPU per
single put by thread role, printed after the table (4 threads: ~105-130 us, of it producers
46-56, writer 32-36, flush 12-14, reput 7-11, ConsumeQueue 4-7, index 4-6).
Session 31 (2026-11-30, idle 2-vCPU Firecracker VM): `put` from 4 threads pays ~5 context
switches and ~10 futex calls per put (perf stat over 42,000 puts: 218,246 switches, 405,883
futex calls), and the kernel's switch and wake-up paths (finish_task_switch,
_raw_spin_unlock_irqrestore) are 39% of the process's samples (perf record -g). The async flush
is the largest helper: one msync of 16 KiB costs 55-75 us of kernel CPU and 190-330 us of wall
time here (storage-free script, 1 KiB writes through a map), about 1,300 a second at 21k puts/s,
and its IO completions wake threads that preempt the writer (0.4 involuntary switches per
put). The row `put 4 threads, flush 16 MiB` is the same case with flush_commitlog_least_pages
at 4096: 24-28k against 15-21k in the same runs. Not a default (RocketMQ's is 4 pages, and
what is not yet flushed is what a power loss may take). Measured and dropped: the store's
helper threads (flush, reput, ConsumeQueue, index) as SCHED_BATCH, so that their wake-ups do
not preempt the writer: +5% median over 10 alternated pairs, inside the spread.
The demo (session 8): 53-59k msgs/s produced, 51-58k consumed. A bounded spin (20-100 us, GIL
released) before a single `put` sleeps on its answer was measured and dropped: on two shared
vCPUs it took the core the writer and dispatch needed (1 and 4 threads slower in 8 of 10 runs).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import queue
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Iterator

import pykka

import mqstore
from mqstore import Message
from mqstore.actors.base import FastInbox
from mqstore.messages import Replied, Waiter
from mqstore.runtime import RuntimeActor

BODY_1K = b"v" * 1024
BODY_128 = b"v" * 128
QUEUES = 4
WINDOW_ASYNC = 1024
WINDOW_ACTOR = 32
BATCH = 32
SETTLE_TIMEOUT_S = 120.0
LAG_WARM_UP = 200
LAG_FIXED_RATE = 30_000.0
WARM_UP_MESSAGES = 5_000


# ---------------------------------------------------------------------------------------------
# the floor: a do-nothing actor with the store's inbox, answering the way the store answers


class _NullActor(pykka.ThreadingActor):
    """Answers every request at once: a Waiter (hand_over, as the writer), an actor (Replied),
    or a future through a completion thread (as put_async's futures are completed)."""

    use_daemon_thread = True

    @staticmethod
    def _create_actor_inbox() -> Any:
        return FastInbox()

    def __init__(self, completions: queue.SimpleQueue[Any]) -> None:
        super().__init__()
        self._completions = completions

    def on_receive(self, message: Any) -> Any:
        kind, target, payload = message
        if kind == "waiter":
            target.hand_over(payload)
        elif kind == "actor":
            target.tell(Replied(correlation_id=payload, answer=payload))
        else:
            self._completions.put(target)
        return None


class _Floor:
    def __init__(self) -> None:
        self.completions: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.ref = _NullActor.start(self.completions)
        self.inbox: FastInbox = self.ref.actor_inbox  # type: ignore[assignment]
        self._thread = threading.Thread(target=self._complete, daemon=True)
        self._thread.start()

    def _complete(self) -> None:
        while (future := self.completions.get()) is not None:
            future.set_result(None)

    def put_async(self, message: Any) -> Future[Any]:
        from pykka._envelope import Envelope

        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        self.inbox.put_keeping_gil(Envelope(("future", future, message)))
        return future

    def put(self, message: Any) -> Any:
        waiter = Waiter()
        self.ref.tell(("waiter", waiter, message))
        return waiter.get()

    def close(self) -> None:
        self.completions.put(None)
        self.ref.stop()


# ---------------------------------------------------------------------------------------------
# the load, against the store or the floor


def _warm_up(store: mqstore.MessageStore) -> None:
    """A new store's first puts pay for its files' first pages (the segment's, the queues',
    the index's hash slots) and its threads' first runs: the first 4,000 put_batch messages
    at 128 B took 2-2.5x as long as the next ones, and a --quick case of 20,000 messages read
    183k msgs/s where 100,000 read 265-310k (session 36). The rows are the running store's
    rates: each case first puts WARM_UP_MESSAGES, untimed, and waits until they are visible."""
    by_queue: dict[int, list[Message]] = collections.defaultdict(list)
    for i in range(WARM_UP_MESSAGES):
        by_queue[i % QUEUES].append(Message(topic="bench", body=BODY_1K, queue_id=i % QUEUES, keys=[f"w{i}"]))
    last: dict[int, int] = {}
    for queue_id, ms in by_queue.items():
        for i in range(0, len(ms), BATCH):
            r = store.put_batch(ms[i : i + BATCH])
            if not r.ok:
                raise RuntimeError(f"warm-up put_batch failed: {r.status.name} {r.detail}")
            last[queue_id] = r.queue_offset + r.msg_num - 1
    _await_visible(store, last)


def _messages(n: int, body: bytes) -> list[Message]:
    return [Message(topic="bench", body=body, queue_id=i % QUEUES, keys=[f"k{i}"]) for i in range(n)]


def _await_visible(store: mqstore.MessageStore, last: dict[int, int]) -> None:
    for queue_id, offset in last.items():
        if not store.wait_for_messages("bench", queue_id, offset, SETTLE_TIMEOUT_S):
            raise RuntimeError(f"bench/{queue_id}: offset {offset} not visible after {SETTLE_TIMEOUT_S}s")


def _windowed(put_async: Callable[[Message], Future[Any]], messages: list[Message], window: int) -> list[Any]:
    pending: collections.deque[Future[Any]] = collections.deque()
    results = []
    for m in messages:
        pending.append(put_async(m))
        if len(pending) >= window:
            results.append(pending.popleft().result())
    results.extend(f.result() for f in pending)
    return results


def case_put_async(store: Any, messages: list[Message]) -> float:
    started = time.perf_counter()
    results = _windowed(store.put_async, messages, WINDOW_ASYNC)
    if isinstance(store, mqstore.MessageStore):
        _await_visible(store, _newest(messages, results))
    return len(messages) / (time.perf_counter() - started)


def _newest(messages: list[Message], results: list[Any]) -> dict[int, int]:
    last: dict[int, int] = {}
    for m, r in zip(messages, results):
        if not r.ok:
            raise RuntimeError(f"put failed: {r.status.name} {r.detail}")
        last[m.queue_id] = max(last.get(m.queue_id, -1), r.queue_offset + max(r.msg_num, 1) - 1)
    return last


def case_put_threads(store: Any, messages: list[Message], threads: int) -> float:
    shares = [messages[t::threads] for t in range(threads)]
    results: list[list[Any]] = [[] for _ in range(threads)]

    def work(t: int) -> None:
        put = store.put
        results[t] = [put(m) for m in shares[t]]

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if isinstance(store, mqstore.MessageStore):
        last: dict[int, int] = {}
        for share, rs in zip(shares, results):
            for q, off in _newest(share, rs).items():
                last[q] = max(last.get(q, -1), off)
        _await_visible(store, last)
    return len(messages) / (time.perf_counter() - started)


def case_put_batch(store: Any, messages: list[Message]) -> float:
    by_queue: dict[int, list[Message]] = collections.defaultdict(list)
    for m in messages:
        by_queue[m.queue_id].append(m)
    batches = [ms[i : i + BATCH] for ms in by_queue.values() for i in range(0, len(ms), BATCH)]
    started = time.perf_counter()
    if isinstance(store, mqstore.MessageStore):
        last: dict[int, int] = {}
        for b in batches:
            r = store.put_batch(b)
            if not r.ok:
                raise RuntimeError(f"put_batch failed: {r.status.name} {r.detail}")
            last[b[0].queue_id] = r.queue_offset + r.msg_num - 1
        _await_visible(store, last)
    else:
        for b in batches:
            store.put(b)
    return len(messages) / (time.perf_counter() - started)


class _Producer(RuntimeActor):
    """Puts `messages` single, `window` in flight; sets `done` when all are answered. On the
    store's runtime inbox (FastInbox), as the demo's producers: each answer is a tell into it."""

    def __init__(self, target: Any, messages: list[Message], window: int, done: Future[list[Any]]) -> None:
        super().__init__()
        self.target, self.messages, self.window, self.done = target, messages, window, done
        self.sent = 0
        self.results: list[Any] = [None] * len(messages)
        self.answered = 0

    def on_start(self) -> None:
        if isinstance(self.target, mqstore.MessageStore):
            client = self.target.actor_client(self.actor_ref)
            self.send: Callable[[int], object] = lambda i: client.put(self.messages[i], correlation_id=i)
        else:
            ref = self.target.ref
            self.send = lambda i: ref.tell(("actor", self.actor_ref, i))
        for _ in range(self.window):
            self._next()

    def _next(self) -> None:
        if self.sent < len(self.messages):
            self.send(self.sent)
            self.sent += 1

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Replied):
            self.results[message.correlation_id] = message.answer
            self.answered += 1
            if self.answered == len(self.messages):
                self.done.set_result(self.results)
            else:
                self._next()
        return None


def case_actors(store: Any, messages: list[Message], producers: int = 4) -> float:
    shares = [messages[p::producers] for p in range(producers)]
    dones: list[Future[list[Any]]] = [Future() for _ in range(producers)]
    started = time.perf_counter()
    refs = [_Producer.start(store, shares[p], WINDOW_ACTOR, dones[p]) for p in range(producers)]
    try:
        outcomes = [d.result(timeout=SETTLE_TIMEOUT_S) for d in dones]
        if isinstance(store, mqstore.MessageStore):
            last: dict[int, int] = {}
            for share, rs in zip(shares, outcomes):
                for q, off in _newest(share, rs).items():
                    last[q] = max(last.get(q, -1), off)
            _await_visible(store, last)
        return len(messages) / (time.perf_counter() - started)
    finally:
        for r in refs:
            r.stop()


def case_lag(store: mqstore.MessageStore, messages: list[Message], rate: float) -> tuple[float, float]:
    """put_async paced at `rate` msgs/s to queue 0; a consumer long-polls and gets; lag =
    visible through get - put_async call."""
    warm_up, messages = messages[:LAG_WARM_UP], messages[LAG_WARM_UP:]
    n = len(messages)
    put_at: dict[int, float] = {}
    lags: list[float] = []
    # Steady state: the queue's first puts after open create its files and the completion
    # thread (the first put after open is stored in ~1-8 ms); put and settle them first.
    for f in [store.put_async(m._replace(queue_id=0)) for m in warm_up]:
        if not f.result().ok:
            raise RuntimeError("lag warm-up put failed")
    base = store.max_offset("bench", 0)
    if not store.wait_for_messages("bench", 0, base - 1, SETTLE_TIMEOUT_S):
        raise RuntimeError("lag warm-up not visible")

    def consume() -> None:
        offset = base
        while offset < base + n:
            if not store.wait_for_messages("bench", 0, offset, SETTLE_TIMEOUT_S):
                return
            got = store.get("bench", 0, offset, 32)
            now = time.perf_counter()
            for m in got.messages:
                lags.append(now - put_at[m.queue_offset])
            offset = got.next_begin_offset

    consumer = threading.Thread(target=consume)
    futures = []
    consumer.start()
    # Paced in 1 ms ticks (a producer that sleeps between bursts, as a server does between
    # requests): a busy-waiting producer would hold the GIL and measure the GIL, not the store.
    per_tick = max(1, round(rate / 1000))
    started = time.perf_counter()
    for i, m in enumerate(messages):
        if i % per_tick == 0:
            due = started + (i // per_tick) / 1000
            if (gap := due - time.perf_counter()) > 0:
                time.sleep(gap)
        put_at[base + i] = time.perf_counter()
        futures.append(store.put_async(m._replace(queue_id=0)))
        # A producer checks its answers as they come rather than holding every future: 20k
        # held futures made a gen-2 collection of ~30 ms, the harness's pause, not the store's.
        if len(futures) >= 2 * WINDOW_ASYNC:
            for f in futures[:WINDOW_ASYNC]:
                if not f.result().ok:
                    raise RuntimeError("lag put failed")
            del futures[:WINDOW_ASYNC]
    for f in futures:
        if not f.result().ok:
            raise RuntimeError("lag put failed")
    consumer.join(SETTLE_TIMEOUT_S)
    lags.sort()
    return lags[len(lags) // 2] * 1000, lags[min(len(lags) - 1, int(len(lags) * 0.99))] * 1000


# ---------------------------------------------------------------------------------------------
# where the CPU goes: per-thread CPU time, and the whole process on one CPU


def _thread_cpu_ns() -> dict[int, int]:
    """CPU time so far of each thread of this process (/proc/self/task/<tid>/schedstat: the
    scheduler's own account, in ns, user and system together), by native thread id."""
    cpu: dict[int, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                cpu[int(tid)] = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            pass
    return cpu


def _role(name: str) -> str:
    """A thread's role in the table: pykka names actor threads `<Class>-<n>`."""
    if name.startswith("bench-producer"):
        return "producers"
    return name.rsplit("-", 1)[0] if name[-1:].isdigit() else name


def put_threads_cpu(store: mqstore.MessageStore, messages: list[Message], threads: int) -> dict[str, float]:
    """`put` from `threads` threads, until every message is visible: the CPU each role spent
    per put (us; "wall" is the elapsed time per put), read from the scheduler's per-thread
    account before the producers end. Linux only."""
    shares = [messages[t::threads] for t in range(threads)]
    finished = threading.Barrier(threads + 1, timeout=SETTLE_TIMEOUT_S)
    results: list[list[Any]] = [[] for _ in range(threads)]

    def work(t: int) -> None:
        put = store.put
        results[t] = [put(m) for m in shares[t]]
        finished.wait()  # alive until their CPU time is read
        finished.wait()

    workers = [threading.Thread(target=work, args=(t,), name=f"bench-producer-{t}") for t in range(threads)]
    names: dict[int, str] = {}
    before = _thread_cpu_ns()
    started = time.perf_counter()
    for w in workers:
        w.start()
    finished.wait()
    last: dict[int, int] = {}
    for share, rs in zip(shares, results):
        for q, off in _newest(share, rs).items():
            last[q] = max(last.get(q, -1), off)
    _await_visible(store, last)
    elapsed = time.perf_counter() - started
    after = _thread_cpu_ns()
    for thread in threading.enumerate():
        if thread.native_id is not None:
            names[thread.native_id] = thread.name
    finished.wait()
    for w in workers:
        w.join()
    per_role: dict[str, float] = collections.defaultdict(float)
    for tid, ns in after.items():
        spent = ns - before.get(tid, 0)
        if spent > 0 and tid in names:
            per_role[_role(names[tid])] += spent / 1000 / len(messages)
    figures = {role: round(us, 2) for role, us in sorted(per_role.items(), key=lambda kv: -kv[1]) if us >= 0.05}
    figures["total"] = round(sum(per_role.values()), 2)
    figures["wall"] = round(elapsed * 1e6 / len(messages), 2)
    return figures


@contextlib.contextmanager
def _one_cpu() -> Iterator[int]:
    """Every thread of this process (and so every thread they start) on one CPU, the last
    one allowed; each thread's own set of CPUs back afterwards."""
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    tids = [int(tid) for tid in os.listdir("/proc/self/task")]
    saved: dict[int, set[int]] = {}
    for tid in tids:
        try:
            saved[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, {cpu})
        except (ProcessLookupError, FileNotFoundError):
            pass
    try:
        yield cpu
    finally:
        for tid, mask in saved.items():
            try:
                os.sched_setaffinity(tid, mask)
            except (ProcessLookupError, FileNotFoundError):
                pass


def run(quick: bool) -> dict[str, Any]:
    n = 20_000 if quick else 100_000
    threads_n = 8_000 if quick else 40_000
    figures: dict[str, Any] = {"messages": n, "machine_note": "2 vCPUs shared with other sessions: compare ratios"}
    rows: list[tuple[str, float, float | None, float | None]] = []

    def measure(name: str, ours: Callable[[Any], float], floor: Callable[[Any], float] | None,
                target: float | None = None, **settings: Any) -> float:  # fmt: skip
        with tempfile.TemporaryDirectory() as root:
            store = mqstore.open(root, mapped_file_size_commitlog_bytes=512 << 20, max_puts_in_flight=WINDOW_ASYNC,
                                 **settings)  # fmt: skip
            try:
                _warm_up(store)
                ours_rate = ours(store)
            finally:
                store.close()
        floor_rate = None
        if floor is not None:
            f = _Floor()
            try:
                floor_rate = floor(f)
            finally:
                f.close()
        rows.append((name, ours_rate, floor_rate, target))
        floor_text = f"{'-':>14}{'-':>8}" if floor_rate is None else f"{floor_rate:>14,.0f}{ours_rate / floor_rate:>8.2f}"
        target_text = "" if target is None else f"{target:>10,.0f}{ours_rate / target:>11.2f}"
        print(f"{name:<28}{ours_rate:>12,.0f}{floor_text}{target_text}", flush=True)
        return ours_rate

    # The ratio is to the same-run floor (issue 16 asks >= 0.8 of it where the target is not
    # met); "of target" is the rate over issue 16's target on an idle 2-vCPU machine.
    print(f"{'case (msgs/s, until visible)':<28}{'mqstore':>12}{'floor':>14}{'ratio':>8}{'target':>10}{'of target':>11}")
    m1k = _messages(n, BODY_1K)
    m128 = _messages(n, BODY_128)
    lag_n = 5_000 if quick else 20_000
    m_lag = _messages(lag_n + LAG_WARM_UP, BODY_1K)
    # The harness's own 0.7M objects (the messages above) out of the collector: a gen-2 pass
    # over them took ~30 ms, a pause of the harness that the lag and rates would charge to
    # the store. What the store and each case allocate is still collected as usual.
    gc.collect()
    gc.freeze()
    async_rate = measure("put_async 1 thread, 1024", lambda s: case_put_async(s, m1k), lambda f: case_put_async(f, m1k), 100_000)
    measure("4 actors, window 32", lambda s: case_actors(s, m1k), lambda f: case_actors(f, m1k), 60_000)
    mt = m1k[:threads_n]
    single = measure("put 1 thread", lambda s: case_put_threads(s, mt, 1), lambda f: case_put_threads(f, mt, 1))
    four = measure("put 4 threads", lambda s: case_put_threads(s, mt, 4), lambda f: case_put_threads(f, mt, 4), 25_000)
    measure("put 16 threads", lambda s: case_put_threads(s, mt, 16), lambda f: case_put_threads(f, mt, 16), four)
    # The async flush's share of that figure: the same case with the flush every 16 MiB instead
    # of RocketMQ's 4 pages (each msync of 16 KiB costs 55-75 us of kernel CPU here). Not a
    # default: what it buys is paid in what a power loss may take (never a process crash).
    measure("put 4 threads, flush 16 MiB", lambda s: case_put_threads(s, mt, 4), lambda f: case_put_threads(f, mt, 4),
            25_000, flush_commitlog_least_pages=4096)  # fmt: skip
    if len(os.sched_getaffinity(0)) > 1:
        # The design the note proposes, measured: a put's whole chain (the caller, the writer,
        # dispatch) on one CPU, where a wake-up needs no other CPU to be woken.
        with _one_cpu():
            measure("put 4 threads, 1 CPU", lambda s: case_put_threads(s, mt, 4), lambda f: case_put_threads(f, mt, 4),
                    25_000)  # fmt: skip
    measure("put_batch 32, 1 KiB", lambda s: case_put_batch(s, m1k), lambda f: case_put_batch(f, m1k), 130_000)
    measure("put_batch 32, 128 B", lambda s: case_put_batch(s, m128), lambda f: case_put_batch(f, m128), 250_000)
    # Half of this run's put_async rate (issue 16's "half load"), and a fixed rate that stays
    # comparable between versions: half load moves with put_async (31k/s before the one-call
    # put path and the writer's fast append, ~58k/s after).
    lags: dict[float, tuple[float, float]] = {}
    for rate in (async_rate / 2, LAG_FIXED_RATE):
        with tempfile.TemporaryDirectory() as root:
            store = mqstore.open(root, mapped_file_size_commitlog_bytes=512 << 20, max_puts_in_flight=WINDOW_ASYNC)
            try:
                _warm_up(store)
                lags[rate] = case_lag(store, m_lag, rate)
            finally:
                store.close()
    p50, p99 = lags[async_rate / 2]
    print(f"lag at half load ({async_rate / 2:,.0f}/s): p50 {p50:.2f} ms, p99 {p99:.2f} ms (target p99 <= 5 ms)")
    fixed50, fixed99 = lags[LAG_FIXED_RATE]
    print(f"lag at {LAG_FIXED_RATE:,.0f}/s: p50 {fixed50:.2f} ms, p99 {fixed99:.2f} ms")
    figures["cases"] = [{"case": c, "msgs_per_s": round(o), "floor_msgs_per_s": None if f is None else round(f),
                         "ratio_to_floor": None if f is None else round(o / f, 3),
                         "target_msgs_per_s": None if t is None else round(t),
                         "of_target": None if t is None else round(o / t, 3)} for c, o, f, t in rows]  # fmt: skip
    figures["lag_half_load"] = {"rate": round(async_rate / 2), "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}
    figures["lag_fixed_rate"] = {"rate": LAG_FIXED_RATE, "p50_ms": round(fixed50, 3), "p99_ms": round(fixed99, 3)}
    figures["single_put_one_thread"] = round(single)
    # Where a single put's CPU goes (us per put, all threads of the store and the producers):
    # the target the note compares with is the floor's, which pays two hand-offs.
    cpu: dict[str, dict[str, float]] = {}
    for threads in (1, 4):
        with tempfile.TemporaryDirectory() as root:
            store = mqstore.open(root, mapped_file_size_commitlog_bytes=512 << 20, max_puts_in_flight=WINDOW_ASYNC)
            try:
                _warm_up(store)
                cpu[f"put {threads} thread{'s' if threads > 1 else ''}"] = put_threads_cpu(store, mt, threads)
            finally:
                store.close()
    print("CPU per put, us (user + system, per thread role; until visible):")
    for case, roles in cpu.items():
        print(f"  {case:<15}" + ", ".join(f"{role} {us:.1f}" for role, us in roles.items()))
    figures["cpu_us_per_put"] = cpu
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts (about a minute)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    figures = run(args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
