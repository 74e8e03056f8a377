"""Our store through its public API only (`mqstore.open`, put/put_batch/get/query/...).

If the API is missing the cases fail loudly (status "failed", exit code 1): a benchmark
that silently drops our own row would report only the competition.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mqstore.bench.harness import ASYNC, Outcome, Recorder, percentile, timed
from mqstore.bench.workload import BATCH_SIZE_MSGS, BenchConfig, BenchMessage

SETTLE_TIMEOUT_S = 60.0  # dispatch (ConsumeQueue + index) catch-up before reads are timed
LAG_POLL_TIMEOUT_S = 5.0


def _api() -> Any:
    import mqstore

    return mqstore


def _message(m: BenchMessage, message_cls: Any = None) -> Any:
    cls = message_cls if message_cls is not None else _api().Message
    return cls(topic=m.topic, queue_id=m.queue_id, body=m.body, tags=m.tag, keys=[m.key])


def _check_put(r: Any, what: str) -> None:
    if not r.ok:
        raise RuntimeError(f"{what} failed: {r.status}")


def _run_threads(work: Sequence[Sequence[BenchMessage]], fn: Callable[[BenchMessage], None]) -> None:
    from mqstore.bench.alternatives import run_threads

    run_threads(work, lambda _t, m: fn(m))


class OursAsync:
    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        self.path = path
        self.store = _api().open(path, flush_disk_type="ASYNC_FLUSH", **config)
        self.store.__enter__()
        self.last_key: tuple[str, str] | None = None

    def append(self, batches: Sequence[Sequence[BenchMessage]]) -> None:
        """Timed: every batch put, then every message visible through get (issue 3 counts a
        put_batch done end to end: dispatch to the ConsumeQueue included)."""
        put_batch = self.store.put_batch
        message_cls = _api().Message
        newest: dict[tuple[str, int], int] = {}
        for batch in batches:
            rs = put_batch([_message(m, message_cls) for m in batch])
            _check_put(rs, "put_batch")
            newest[(batch[0].topic, batch[0].queue_id)] = rs.queue_offset + rs.msg_num - 1
        for (topic, queue_id), offset in newest.items():
            if not self.store.wait_for_messages(topic, queue_id, offset, SETTLE_TIMEOUT_S):
                raise RuntimeError(f"{topic}/{queue_id}: offset {offset} not visible after {SETTLE_TIMEOUT_S}s")
        self.last_key = (batches[-1][-1].topic, batches[-1][-1].key)

    def settle(self, per_queue: dict[tuple[str, int], int]) -> None:
        """Waits (untimed) until the reput has dispatched everything: reads then measure reads."""
        for (topic, queue_id), count in per_queue.items():
            if not self.store.wait_for_messages(topic, queue_id, count - 1, SETTLE_TIMEOUT_S):
                raise RuntimeError(f"{topic}/{queue_id}: message {count - 1} not visible after {SETTLE_TIMEOUT_S}s")
        if self.last_key is not None:
            # The index has no long poll; poll it, bounded.
            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while not self.store.query(self.last_key[0], self.last_key[1], 1).messages:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"key {self.last_key[1]!r} not indexed after {SETTLE_TIMEOUT_S}s")
                time.sleep(0.005)

    def read_all(self, per_queue: dict[tuple[str, int], int]) -> int:
        read = 0
        get = self.store.get
        for (topic, queue_id), count in per_queue.items():
            offset = 0
            while offset < count:
                g = get(topic, queue_id, offset, BATCH_SIZE_MSGS)
                if not g.messages:
                    raise RuntimeError(f"get {topic}/{queue_id}@{offset}: {g.status}")
                read += len(g.messages)
                offset = g.next_begin_offset
        return read

    def lookup(self, keys: Sequence[str]) -> list[float]:
        lat: list[float] = []
        query = self.store.query
        for k in keys:
            start = time.perf_counter()
            if not query("BenchTopic", k, 32).messages:
                raise LookupError(f"key {k!r} not found")
            lat.append(time.perf_counter() - start)
        return lat

    def put_each(self, per_thread: Sequence[Sequence[BenchMessage]]) -> None:
        """Timed: `put` per message from each thread, then every message visible through get
        (as `append`: the same end to end as the alternatives' commits)."""
        message_cls = _api().Message
        put = self.store.put
        newest: dict[tuple[str, int], int] = {}

        def one(m: BenchMessage) -> None:
            r = put(_message(m, message_cls))
            _check_put(r, "put")
            newest[(m.topic, m.queue_id)] = r.queue_offset  # a thread's own queue: no race

        _run_threads(per_thread, one)
        self._await_visible(newest)

    def put_pipelined(self, messages: Sequence[BenchMessage], window: int) -> None:
        """Timed: `put_async` per message, at most `window` unanswered, every answer checked,
        then every message visible through get."""
        message_cls = _api().Message
        put_async = self.store.put_async
        pending: collections.deque[tuple[BenchMessage, Any]] = collections.deque()
        newest: dict[tuple[str, int], int] = {}

        def settle_oldest() -> None:
            m, future = pending.popleft()
            r = future.result()
            _check_put(r, "put_async")
            newest[(m.topic, m.queue_id)] = r.queue_offset

        for m in messages:
            if len(pending) >= window:
                settle_oldest()
            pending.append((m, put_async(_message(m, message_cls))))
        while pending:
            settle_oldest()
        self._await_visible(newest)

    def _await_visible(self, newest: dict[tuple[str, int], int]) -> None:
        for (topic, queue_id), offset in newest.items():
            if not self.store.wait_for_messages(topic, queue_id, offset, SETTLE_TIMEOUT_S):
                raise RuntimeError(f"{topic}/{queue_id}: offset {offset} not visible after {SETTLE_TIMEOUT_S}s")

    def close(self) -> None:
        self.store.close()


class OursSync:
    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        self.store = _api().open(path, flush_disk_type="SYNC_FLUSH", **config)
        self.store.__enter__()
        self.not_put_ok = 0

    def append_sync(self, per_thread: Sequence[Sequence[BenchMessage]]) -> int:
        put_ok = _api().PutMessageStatus.PUT_OK
        lock = threading.Lock()

        def put(m: BenchMessage) -> None:
            r = self.store.put(_message(m))
            _check_put(r, "put")
            if r.status != put_ok:  # e.g. FLUSH_DISK_TIMEOUT: stored but not acknowledged as flushed
                with lock:
                    self.not_put_ok += 1

        _run_threads(per_thread, put)
        if self.not_put_ok:
            raise RuntimeError(f"{self.not_put_ok} sync puts were not PUT_OK (flush not confirmed)")
        return len(per_thread)

    def close(self) -> None:
        self.store.close()


class OursSystem:
    name = "ours"
    required = True  # missing API = failure, not a skip
    case_names = {"append": "put_batch", "read": "get", "lookup": "query", "append_sync": "sync_put_16"}

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        from mqstore.bench.bench_open import OpenCases

        self.config = dict(config or {})
        self._open_cases = OpenCases(self.config)
        self.notes = {
            "put_batch": "put_batch of 32 (same topic+queue), one thread, timed until every message is visible through get; get in batches of 32; query one key per call",
            "sync_put_16": "SYNC_FLUSH (group commit), 16 producer threads, one put per message; any non-PUT_OK fails the case",
            "put_each_4": "put, one message per call, each answered before the thread's next, thread t on queue t; timed until every message is visible through get (also put_each_16)",
            "put_pipelined": "put_async per message from one thread, at most 1024 unanswered, every answer checked; timed until every message is visible through get",
            "lag": "one producer at ~half its measured max single-put rate, one consumer long-polling wait_for_messages + get; lag = visible - put call start",
        }

    def unavailable_reason(self) -> str | None:
        try:
            api = _api()
        except ImportError as e:
            return f"mqstore not importable: {e}"
        missing = [n for n in ("open", "Message", "PutMessageStatus") if not hasattr(api, n)]
        if missing:
            return f"mqstore public API missing: {', '.join('mqstore.' + n for n in missing)}"
        return None

    def durability(self) -> dict[str, str]:
        return {"async": "flush_disk_type=ASYNC_FLUSH", "sync": "flush_disk_type=SYNC_FLUSH, 16 producers"}

    def versions(self) -> dict[str, str]:
        return {"mqstore": str(getattr(_api(), "__version__", "?"))}

    def open_async(self, path: Path, size_hint_bytes: int) -> OursAsync:
        return OursAsync(path, self.config)

    def open_sync(self, path: Path, size_hint_bytes: int) -> OursSync:
        return OursSync(path, self.config)

    # ---- cases only we have

    def extra_cases(
        self, rec: Recorder, cfg: BenchConfig, body: int, messages: Sequence[BenchMessage], work_dir: Path
    ) -> None:
        """Put-to-visible lag, the recovery scan and opening a store (clean, after kill -9;
        bench_open.py), one repeat each call."""
        from mqstore.bench.harness import run_case

        run_case(rec, self.name, "lag", ASYNC, body, lambda: self._lag(cfg, messages, work_dir / "lag"))
        self._open_cases.run(rec, cfg, body, work_dir)

    def _lag(self, cfg: BenchConfig, messages: Sequence[BenchMessage], path: Path) -> Outcome:
        n = min(cfg.lag_messages, len(messages))
        msgs = [_message(m._replace(topic="LagTopic", queue_id=0)) for m in messages[:n]]
        warm = [_message(m._replace(topic="LagWarm", queue_id=0)) for m in messages[:n]]
        with _api().open(path, flush_disk_type="ASYNC_FLUSH", **self.config) as store:
            start = time.perf_counter()
            for m in warm:
                _check_put(store.put(m), "put")
            interval_s = 2.0 * (time.perf_counter() - start) / n  # half the measured max rate
            put_at = [0.0] * n
            lags: list[float] = []
            errors: list[str] = []

            def consume() -> None:
                offset = 0
                while offset < n:
                    if not store.wait_for_messages("LagTopic", 0, offset, LAG_POLL_TIMEOUT_S):
                        errors.append(f"offset {offset} not visible within {LAG_POLL_TIMEOUT_S}s")
                        return
                    g = store.get("LagTopic", 0, offset, BATCH_SIZE_MSGS)
                    now = time.perf_counter()
                    lags.extend(now - put_at[m.queue_offset] for m in g.messages)
                    offset = g.next_begin_offset

            consumer = threading.Thread(target=consume, name="bench-lag-consumer")
            with timed() as t:
                consumer.start()
                t0 = time.perf_counter()
                for i, m in enumerate(msgs):
                    wait = t0 + i * interval_s - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)  # pacing the producer is the point here
                    put_at[i] = time.perf_counter()
                    _check_put(store.put(m), "put")
                consumer.join()
        if errors:
            raise RuntimeError(errors[0])
        metrics = {
            "msgs_per_s": n / t.elapsed_s,
            "p50_us": percentile(lags, 50) * 1e6,
            "p99_us": percentile(lags, 99) * 1e6,
        }
        return Outcome(metrics, t.peak_rss_mb, f"paced at {1 / interval_s:,.0f} msg/s")
