"""`mqstore demo`: the main job. Producer and consumer actors on a real store, then Spark.

    mqstore demo [--store-dir ./mqstore-data] [--messages N | --duration S] [--no-spark] [--json]

1. Open (or create) the store with the embedded defaults.
2. Start one consumer actor per topic. Each tells the store's gateway `Subscribe`, and each
   `MessageArrived` (an absolute position, so a lost or repeated one costs nothing) makes it
   read the queue that is behind with `store.get` in its own thread until it caught up.
   Consumers start at the queues' max offsets, so earlier runs' messages are not consumed.
3. Start the producer actors. Each keeps a window of puts in flight through its
   `store.actor_client(self.actor_ref)` (encoded in the producer's thread, told straight to the
   writer, which appends every put waiting in one pass) and sends the next message when an
   answer (`Replied`) arrives.
4. Meanwhile tqdm shows on stderr: consumed/put counts, put and get rates (the store's own
   StoreStats), consumer lag and disk used.
5. When the producers are done and the consumers caught up, query every acknowledged key (or a
   sample, see --query), close the store, run the Spark stats job over its files in local
   mode, and print a report: per topic counts, throughput, latency percentiles, disk used.

Exit 0 only if every PUT_OK message was consumed exactly once, in queue order, and was found by
its key, no put failed, the store closed cleanly and the Spark counts match the queues.
Exit 1 otherwise (the report says what went wrong); 4 if another process holds the store.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import pykka

from ..cli import CliError, ExitCode, load_config, store_path
from ..log import get_logger
from ..runtime import RuntimeActor
from ..messages import GetResult, Message, MessageArrived, PutResult, Replied, Subscribe, Unsubscribe
from ..stats import disk_allocated_bytes
from ..storage.status import PutMessageStatus

__all__ = ["add_subcommands", "run_demo", "DemoPlan"]

log = get_logger(__name__)

DEFAULT_MESSAGES: Final = 150_000
TOPICS: Final = ("DemoOrders", "DemoPayments", "DemoShipments")
GET_BATCH: Final = 32
CATCH_UP_TIMEOUT_S: Final = 120.0
CATCH_UP_STALL_S = 5.0  # consumers that made no progress for this long are stuck
PROGRESS_INTERVAL_S: Final = 0.5
MAX_FAILURES_LISTED: Final = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoPlan:
    messages: int | None  # None: run for `duration_s`
    duration_s: float | None
    producers: int = 4
    queues: int = 4
    window: int = 32  # puts in flight per producer
    body_bytes: int = 256
    topics: tuple[str, ...] = TOPICS
    query: str = "all"  # "all", "sample" or "none"


# ---------------------------------------------------------------------------------------------
# the shared tally (a lock and counters: the UI thread reads it twice a second)


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    put_ok: int = 0
    put_failed: int = 0
    consumed: int = 0

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def read(self) -> tuple[int, int, int]:
        with self.lock:
            return self.put_ok, self.put_failed, self.consumed


@dataclass(frozen=True, slots=True, kw_only=True)
class _SendNext:
    """A producer's nudge to itself: refill the window (used at start)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Finish:
    """Ask a consumer for its results."""


# ---------------------------------------------------------------------------------------------
# producer


@dataclass
class ProducerResult:
    producer_id: int
    acked: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # key -> (topic, queue, queue offset)
    failures: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    put_latency_us: list[float] = field(default_factory=list)
    sent: int = 0


# A producer adds its PUT_OK count to the shared tally (a lock) once per this many answers.
TALLY_EVERY: Final = 256


class ProducerActor(RuntimeActor):
    """Puts its share of the messages through its actor client, `window` at a time. On the
    store's actor runtime (its C-backed inbox): the writer tells each answer as a Replied, and
    pykka's own Queue inbox cost the demo ~10% of its rate."""

    def __init__(self, store: Any, *, producer_id: int, plan: DemoPlan, run_id: str, quota: int | None,
                 deadline: float | None, tally: Tally, done: pykka.ThreadingFuture[ProducerResult]) -> None:  # fmt: skip
        super().__init__()
        self._store = store
        self._plan = plan
        self._run_id = run_id
        self._quota = quota
        self._deadline = deadline
        self._tally = tally
        self._done = done
        self._result = ProducerResult(producer_id)
        self._n0 = producer_id * 1_000_003
        self._in_flight: dict[int, tuple[int, str, int, int]] = {}  # seq -> (send ns, key, topic index, queue)
        self._seq = 0
        self._padding = b"." * plan.body_bytes
        self._key_prefix = f"{run_id}-{producer_id}-"
        self._untallied = 0  # PUT_OK answers not yet added to the tally
        self._put_ok = 0  # PUT_OK answers, into the result's statuses when the producer is done
        self._acked = self._result.acked
        self._latency_us = self._result.put_latency_us
        self._topics = plan.topics
        self._queues = plan.queues
        self._body_bytes = plan.body_bytes

    def on_start(self) -> None:
        self._client = self._store.actor_client(self.actor_ref)
        self.actor_ref.tell(_SendNext())

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        self._done.set_exception((exception_type, exception_value, traceback))  # the coordinator re-raises

    def _more(self) -> bool:
        if self._quota is not None:
            return self._seq < self._quota
        assert self._deadline is not None
        return time.monotonic() < self._deadline

    def _send(self) -> None:
        seq = self._seq
        self._seq += 1
        n = self._n0 + seq  # spreads producers over topics and queues
        topics = self._topics
        topic_index = n % len(topics)
        queue_id = (n // len(topics)) % self._queues
        key = self._key_prefix + str(seq)
        sent_ns = time.monotonic_ns()
        head = b"%s|%d|" % (key.encode(), sent_ns)
        body = head + self._padding[: max(self._body_bytes - len(head), 0)]
        self._in_flight[seq] = (sent_ns, key, topic_index, queue_id)
        self._client.put(Message(topics[topic_index], body, queue_id, "demo", (key,)), seq)  # (topic, body, queue_id, tags, keys)

    def _fill(self) -> None:
        while len(self._in_flight) < self._plan.window and self._more():
            self._send()
        if not self._in_flight and not self._more():
            self._tally.add("put_ok", self._untallied)
            self._untallied = 0
            self._result.statuses["PUT_OK"] += self._put_ok
            self._put_ok = 0
            self._result.sent = self._seq
            self._done.set(self._result)
            self.actor_ref.stop(block=False)

    def on_receive(self, message: Any) -> Any:
        # type() tests, not a match on class patterns: this runs once per put.
        if type(message) is Replied:
            sent_ns, key, topic_index, queue_id = self._in_flight.pop(message.correlation_id)
            self._latency_us.append((time.monotonic_ns() - sent_ns) / 1000)
            answer = message.answer
            if type(answer) is PutResult and answer.status is _PUT_OK:
                self._put_ok += 1
                self._acked[key] = (self._plan.topics[topic_index], queue_id, answer.queue_offset)
                self._untallied += 1
                if self._untallied >= TALLY_EVERY:
                    self._tally.add("put_ok", self._untallied)
                    self._untallied = 0
            else:
                name = answer.status.name if isinstance(answer, PutResult) else type(answer).__name__
                self._result.statuses[name] += 1
                if len(self._result.failures) < MAX_FAILURES_LISTED:
                    self._result.failures.append(f"put of {key} failed: {name} {getattr(answer, 'detail', answer)}")
                self._tally.add("put_failed")
            self._fill()
        elif type(message) is _SendNext:
            self._fill()
        else:
            raise AssertionError(f"a producer cannot handle {message!r}")
        return None


_PUT_OK: Final = PutMessageStatus.PUT_OK


# ---------------------------------------------------------------------------------------------
# consumer


@dataclass
class ConsumerResult:
    topic: str
    consumed: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (queue, queue offset)
    duplicates: int = 0
    order_errors: int = 0
    foreign: int = 0  # messages of this topic not written by this run (another writer)
    errors: list[str] = field(default_factory=list)
    latency_us: list[float] = field(default_factory=list)
    bytes: int = 0
    gets: int = 0
    next_offsets: dict[int, int] = field(default_factory=dict)


class ConsumerActor(RuntimeActor):
    """Consumes every queue of one topic, driven by MessageArrived notices: on a notice it
    reads the queue with `store.get` in its own thread until it has caught up (no gateway hop:
    a `Get` told to the gateway cost two thread hand-offs and a reader's wait for the GIL per
    32 messages, and left the consumers seconds behind the producers)."""

    def __init__(self, store: Any, *, topic: str, start_offsets: dict[int, int], run_id: str,
                 tally: Tally) -> None:  # fmt: skip
        super().__init__()
        self._store = store
        self._gateway = store.actor_ref
        self._topic = topic
        self._run_prefix = f"{run_id}-".encode()
        self._tally = tally
        self._next = dict(start_offsets)
        self._known_max = dict(start_offsets)
        self._result = ConsumerResult(topic)

    def on_start(self) -> None:
        self._gateway.tell(Subscribe(subscriber=self.actor_ref, topic=self._topic))

    def on_stop(self) -> None:
        try:
            self._gateway.tell(Unsubscribe(subscriber=self.actor_ref))
        except pykka.ActorDeadError:
            pass  # the store closed first

    def _catch_up(self, queue_id: int) -> None:
        """Read `queue_id` from where this consumer is until the newest offset it knows of."""
        get = self._store.get
        topic = self._topic
        res = self._result
        while (offset := self._next.get(queue_id, 0)) < self._known_max.get(queue_id, 0):
            res.gets += 1
            answer = get(topic, queue_id, offset, GET_BATCH)
            if not answer.found:
                if len(res.errors) < MAX_FAILURES_LISTED and answer.status.name not in (
                    "OFFSET_OVERFLOW_ONE", "NO_MESSAGE_IN_QUEUE",
                ):  # fmt: skip
                    res.errors.append(f"get {topic}/{queue_id}@{offset}: {answer.status.name}")
                return  # the next notice tries again
            self._consume(queue_id, answer)
            self._next[queue_id] = answer.next_begin_offset
            if answer.max_offset > self._known_max.get(queue_id, 0):
                self._known_max[queue_id] = answer.max_offset

    def _consume(self, queue_id: int, result: GetResult) -> None:
        now_ns = time.monotonic_ns()
        expected = self._next.get(queue_id, 0)
        res = self._result
        consumed = res.consumed
        latency = res.latency_us
        run_prefix = self._run_prefix
        size = 0
        for record in result.messages:
            if record.queue_offset != expected:
                res.order_errors += 1
            expected = record.queue_offset + 1
            body = record.body
            if not body.startswith(run_prefix):
                res.foreign += 1
                continue
            key, sent, _ = body.split(b"|", 2)
            k = key.decode()
            if k in consumed:
                res.duplicates += 1
            else:
                consumed[k] = (queue_id, record.queue_offset)
            latency.append((now_ns - int(sent)) / 1000)
            size += record.total_size
        res.bytes += size
        self._tally.add("consumed", len(result.messages))

    def on_receive(self, message: Any) -> Any:
        if type(message) is MessageArrived:
            queue_id = message.queue_id
            if message.max_offset > self._known_max.get(queue_id, 0):
                self._known_max[queue_id] = message.max_offset
            self._next.setdefault(queue_id, 0)
            self._catch_up(queue_id)
        elif type(message) is _Finish:
            self._result.next_offsets = dict(self._next)
            return self._result
        else:
            raise AssertionError(f"a consumer cannot handle {message!r}")
        return None


# ---------------------------------------------------------------------------------------------
# the run


def _percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50/p90/p99/max of microsecond values, in milliseconds."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "count": 0}
    ordered = sorted(values)
    n = len(ordered)

    def at(q: float) -> float:
        return round(ordered[min(n - 1, int(q * n))] / scale, 3)

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": round(ordered[-1] / scale, 3), "count": n}


class _Progress:
    """tqdm on stderr: consumed messages, rates from the store's StoreStats, lag and disk."""

    def __init__(self, plan: DemoPlan, enabled: bool) -> None:
        self.bar: Any = None
        if not enabled:
            return
        from tqdm import tqdm

        total = plan.messages if plan.messages is not None else None
        self.bar = tqdm(total=total, file=sys.stderr, unit="msg", desc="consumed", dynamic_ncols=True,
                        mininterval=PROGRESS_INTERVAL_S)  # fmt: skip
        self._shown = 0

    def update(self, tally: Tally, store: Any, root: str) -> None:
        if self.bar is None:
            return
        put_ok, failed, consumed = tally.read()
        snap = store.stats_service.snapshot()
        allocated, _ = disk_allocated_bytes(root)
        self.bar.update(consumed - self._shown)
        self._shown = consumed
        self.bar.set_postfix_str(
            f"put {put_ok} ({snap['put_tps']['10s']:.0f}/s) get {snap['get_transfered_tps']['10s']:.0f}/s "
            f"lag {put_ok - consumed} failed {failed} disk {allocated / 2**20:.1f} MiB",
            refresh=False,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_demo(store_dir: Path, plan: DemoPlan, *, config_args: argparse.Namespace | None = None, spark: bool = True,
             spark_master: str = "local[2]", progress: bool = True) -> dict[str, Any]:  # fmt: skip
    """Run the demo and return its report (the dict `--json` prints). Never raises for a lost
    message: `report["ok"]` and `report["failures"]` say what happened."""
    import mqstore

    started = time.monotonic()
    failures: list[str] = []
    run_id = uuid.uuid4().hex[:12]
    root = str(store_dir)
    overrides = {"store_path_root_dir": root}
    config = load_config(config_args, **overrides) if config_args is not None else mqstore.StoreConfig.load(overrides=overrides)
    try:
        store = mqstore.open_store(config=config)
    except mqstore.StoreLockedError as exc:
        raise CliError(ExitCode.LOCKED, str(exc)) from None
    opened_s = time.monotonic() - started
    tally = Tally()
    consumers: dict[str, pykka.ActorRef[Any]] = {}
    producers: list[pykka.ActorRef[Any]] = []
    done_futures: list[pykka.ThreadingFuture[ProducerResult]] = []
    bar = _Progress(plan, progress)
    try:
        start_offsets = {t: {q: store.max_offset(t, q) for q in range(plan.queues)} for t in plan.topics}
        before = {t: sum(start_offsets[t].values()) for t in plan.topics}
        for topic in plan.topics:
            ref = ConsumerActor.start(store, topic=topic, start_offsets=start_offsets[topic], run_id=run_id, tally=tally)
            consumers[topic] = ref
        for ref in consumers.values():  # the start handshake: each has subscribed before any put
            ref.ask(_Finish(), timeout=10)
        produce_started = time.monotonic()
        deadline = produce_started + plan.duration_s if plan.duration_s is not None else None
        for i in range(plan.producers):
            quota = None
            if plan.messages is not None:
                quota = plan.messages // plan.producers + (1 if i < plan.messages % plan.producers else 0)
            future: pykka.ThreadingFuture[ProducerResult] = pykka.ThreadingFuture()
            done_futures.append(future)
            producers.append(ProducerActor.start(store, producer_id=i, plan=plan, run_id=run_id, quota=quota,
                                                 deadline=deadline, tally=tally, done=future))  # fmt: skip
        # Producers finish on their own; wait for them while drawing progress.
        produce_limit = time.monotonic() + (plan.duration_s or 0) + 600
        results: list[ProducerResult] = []
        for future in done_futures:
            while True:
                try:
                    results.append(future.get(timeout=PROGRESS_INTERVAL_S))
                    break
                except pykka.Timeout:
                    bar.update(tally, store, root)
                    if time.monotonic() > produce_limit:
                        raise RuntimeError("the producers did not finish in time") from None
        produced_s = time.monotonic() - produce_started
        acked: dict[str, tuple[str, int, int]] = {}
        statuses: Counter[str] = Counter()
        put_latency: list[float] = []
        for r in results:
            acked.update(r.acked)
            statuses.update(r.statuses)
            put_latency.extend(r.put_latency_us)
            failures.extend(r.failures)
        # Consumers catch up on their own; one repeated notice per queue covers a lost one.
        for topic, ref in consumers.items():
            for q in range(plan.queues):
                ref.tell(MessageArrived(topic=topic, queue_id=q, max_offset=store.max_offset(topic, q), store_timestamp=0))
        catch_up_limit = time.monotonic() + CATCH_UP_TIMEOUT_S
        last_count, last_change = -1, time.monotonic()
        while (count := tally.read()[2]) < len(acked) and time.monotonic() < catch_up_limit:
            if count != last_count:
                last_count, last_change = count, time.monotonic()
            elif time.monotonic() - last_change > CATCH_UP_STALL_S:
                break  # no progress: what is missing now is missing; the checks below say so
            bar.update(tally, store, root)
            time.sleep(0.05)  # a UI refresh, not a wait for correctness: the counts decide
        bar.update(tally, store, root)
        consumed_s = time.monotonic() - produce_started
        consumer_results: list[ConsumerResult] = [cast(ConsumerResult, ref.ask(_Finish(), timeout=30)) for ref in consumers.values()]
    finally:
        bar.close()
        for ref in producers + list(consumers.values()):
            try:
                ref.stop(block=True, timeout=5)
            except (pykka.ActorDeadError, pykka.Timeout):
                pass
    # --- the checks -----------------------------------------------------------------------
    consumed: dict[str, tuple[str, int, int]] = {}
    duplicates = order_errors = foreign = 0
    latency: list[float] = []
    consumed_bytes: dict[str, int] = {}
    for c in consumer_results:
        for key, (queue_id, offset) in c.consumed.items():
            consumed[key] = (c.topic, queue_id, offset)
        duplicates += c.duplicates
        order_errors += c.order_errors
        foreign += c.foreign
        latency.extend(c.latency_us)
        consumed_bytes[c.topic] = c.bytes
        failures.extend(c.errors)
    missing = [k for k in acked if k not in consumed]
    unexpected = [k for k in consumed if k not in acked]
    misplaced = [k for k, where in acked.items() if k in consumed and consumed[k] != where]
    if missing:
        failures.append(f"{len(missing)} acknowledged messages were not consumed, e.g. {missing[:3]}")
    if unexpected:
        failures.append(f"{len(unexpected)} consumed messages were never acknowledged, e.g. {unexpected[:3]}")
    if misplaced:
        failures.append(f"{len(misplaced)} messages were consumed at another queue/offset than acknowledged")
    if duplicates:
        failures.append(f"{duplicates} messages were consumed more than once")
    if order_errors:
        failures.append(f"{order_errors} gaps or reorderings in queue offsets")
    if statuses.total() - statuses["PUT_OK"]:
        failures.append(f"{statuses.total() - statuses['PUT_OK']} puts failed: {dict(statuses)}")
    # --- queries by key -------------------------------------------------------------------
    query_started = time.monotonic()
    keys = list(acked)
    if plan.query == "sample":
        keys = random.sample(keys, min(len(keys), 1000))
    elif plan.query == "none":
        keys = []
    not_found = [k for k in keys if not _found_by_key(store, acked[k][0], k)]
    query_s = time.monotonic() - query_started
    if not_found:
        failures.append(f"{len(not_found)} of {len(keys)} keys were not found by query, e.g. {not_found[:3]}")
    in_store = {t: sum(store.max_offset(t, q) - store.min_offset(t, q) for q in range(plan.queues)) for t in plan.topics}
    stats = store.stats()
    clean = store.close()
    if not clean:
        failures.append("the store did not close cleanly (the abort file stays)")
    allocated, apparent = disk_allocated_bytes(root)
    # --- spark ----------------------------------------------------------------------------
    spark_report = _run_spark(root, spark, spark_master, in_store, failures)
    per_topic: dict[str, dict[str, Any]] = {}
    for topic in plan.topics:
        mine = [k for k, v in acked.items() if v[0] == topic]
        per_topic[topic] = {
            "put_ok": len(mine),
            "consumed": sum(1 for k in mine if k in consumed),
            "bytes": stats["put_topic"][topic]["bytes"] if topic in stats["put_topic"] else 0,
            "messages_before_run": before[topic],
            "messages_in_store": in_store[topic],
            "spark_messages": spark_report.get("topics", {}).get(topic),
        }
    total_s = time.monotonic() - started
    report = {
        "ok": not failures,
        "failures": failures,
        "store_dir": os.path.abspath(root),
        "run_id": run_id,
        "plan": {"messages": plan.messages, "duration_s": plan.duration_s, "producers": plan.producers,
                 "consumers": len(plan.topics), "topics": list(plan.topics), "queues": plan.queues,
                 "window": plan.window, "body_bytes": plan.body_bytes},  # fmt: skip
        "produced": {"sent": sum(r.sent for r in results), "put_ok": len(acked), "statuses": dict(statuses)},
        "consumed": {"messages": len(consumed), "duplicates": duplicates, "missing": len(missing),
                     "unexpected": len(unexpected), "order_errors": order_errors, "foreign": foreign},  # fmt: skip
        "queried": {"mode": plan.query, "keys": len(keys), "found": len(keys) - len(not_found), "seconds": round(query_s, 3)},
        "topics": per_topic,
        "throughput": {
            "produce_seconds": round(produced_s, 3),
            "put_per_s": round(len(acked) / produced_s, 1) if produced_s else None,
            "consume_seconds": round(consumed_s, 3),
            "consume_per_s": round(len(consumed) / consumed_s, 1) if consumed_s else None,
        },
        "latency_ms": {"put": _percentiles(put_latency), "put_to_consume": _percentiles(latency)},
        "store_stats": {k: stats[k] for k in ("put_message_times_total", "put_message_size_total",
                        "put_message_failed_times", "put_message_entire_time_max_ms", "put_message_distribute_time_total",
                        "get_message_times_total_found", "get_message_times_total_miss",
                        "get_message_transfered_msg_count", "dispatch_max_buffer_bytes", "process")},  # fmt: skip
        "disk": {"allocated_bytes": allocated, "apparent_bytes": apparent},
        "closed_cleanly": clean,
        "spark": spark_report,
        "seconds": {"open": round(opened_s, 3), "total": round(total_s, 3)},
    }
    log.info("demo finished", ok=report["ok"], failures=len(failures))
    return report


def _found_by_key(store: Any, topic: str, key: str) -> bool:
    result = store.query(topic, key, 4)
    return any(key in m.key_list for m in result.messages)


def _run_spark(root: str, enabled: bool, master: str, in_store: dict[str, int], failures: list[str]) -> dict[str, Any]:
    if not enabled:
        return {"ran": False, "note": "skipped (--no-spark)"}
    try:
        from ..pipeline.session import get_spark
        from ..pipeline.stats import compute_stats
    except ImportError as exc:
        return {"ran": False, "note": f"skipped: pyspark is not importable ({exc})"}
    from pyspark import SparkContext

    # A host that runs the demo in its own process may have Spark running: get_spark then hands
    # out the host's session, which is the host's to stop (stopping it left the host's session
    # without its SparkContext and the `rocketmq` source: DATA_SOURCE_NOT_FOUND at its next load).
    borrowed = SparkContext._active_spark_context is not None
    started = time.monotonic()
    try:
        spark = get_spark(master, app_name="mqstore-demo", progress=False)
        try:
            ready_s = time.monotonic() - started
            result = compute_stats(spark, [root])
        finally:
            if not borrowed:
                spark.stop()
    except Exception as exc:  # no Java, a job error: the report says so and the demo fails
        log.error("spark stats job failed", error=repr(exc))
        failures.append(f"the Spark stats job failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return {"ran": False, "note": f"failed: {type(exc).__name__}"}
    topics: dict[str, int] = defaultdict(int)
    for q in result["queues"]:
        topics[q["topic"]] += q["messages"]
    mismatched = {t: (topics.get(t, 0), n) for t, n in in_store.items() if topics.get(t, 0) != n}
    if mismatched:
        failures.append(f"Spark counted other numbers than the queues hold (spark, queues): {mismatched}")
    if result["corrupt_records"]:
        failures.append(f"Spark found {result['corrupt_records']} corrupt records")
    return {
        "ran": True,
        "master": master,
        "seconds": round(time.monotonic() - started, 3),
        "session_start_seconds": round(ready_s, 3),
        "messages": result["messages"],
        "bytes": result["bytes"],
        "corrupt_records": result["corrupt_records"],
        "topics": dict(topics),
        "matches_queues": not mismatched,
    }


# ---------------------------------------------------------------------------------------------
# printing and the subcommand


def _print_report(r: dict[str, Any], out: Any) -> None:
    w = out.write
    plan = r["plan"]
    w(f"mqstore demo on {r['store_dir']} (run {r['run_id']}): {'OK' if r['ok'] else 'FAILED'}\n")
    w(f"  {plan['producers']} producer actors, {plan['consumers']} consumer actors, {len(plan['topics'])} topics x "
      f"{plan['queues']} queues, {plan['body_bytes']}-byte bodies, window {plan['window']}\n")  # fmt: skip
    w(f"\n  {'topic':<16}{'put ok':>10}{'consumed':>10}{'bytes':>12}{'in store':>10}{'spark':>10}\n")
    for topic, t in r["topics"].items():
        spark = "-" if t["spark_messages"] is None else t["spark_messages"]
        w(f"  {topic:<16}{t['put_ok']:>10}{t['consumed']:>10}{t['bytes']:>12}{t['messages_in_store']:>10}{spark:>10}\n")
    th = r["throughput"]
    w(f"\n  produced {r['produced']['put_ok']} in {th['produce_seconds']} s ({th['put_per_s']}/s, pipelined: "
      f"actor client, window {plan['window']} per producer); "
      f"consumed {r['consumed']['messages']} in {th['consume_seconds']} s ({th['consume_per_s']}/s)\n")  # fmt: skip
    c = r["consumed"]
    w(f"  duplicates {c['duplicates']}, missing {c['missing']}, unexpected {c['unexpected']}, order errors {c['order_errors']}\n")
    q = r["queried"]
    w(f"  queried {q['keys']} keys ({q['mode']}) in {q['seconds']} s: {q['found']} found\n")
    for name, p in r["latency_ms"].items():
        w(f"  {name.replace('_', '-')} latency ms: p50 {p['p50']}  p90 {p['p90']}  p99 {p['p99']}  max {p['max']}\n")
    d = r["disk"]
    w(f"  disk: {d['allocated_bytes'] / 2**20:.1f} MiB allocated ({d['apparent_bytes'] / 2**20:.0f} MiB apparent, sparse segments)\n")
    s = r["spark"]
    if s["ran"]:
        w(f"  spark ({s['master']}): {s['messages']} messages, {s['bytes']} bytes in {s['seconds']} s "
          f"(session {s['session_start_seconds']} s); matches the queues: {s['matches_queues']}\n")  # fmt: skip
    else:
        w(f"  spark: {s['note']}\n")
    w(f"  closed cleanly: {r['closed_cleanly']}; total {r['seconds']['total']} s\n")
    for f in r["failures"]:
        w(f"  FAILURE: {f}\n")


def add_subcommands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the main job: producer and consumer actors on a store, live progress, Spark stats, a report",
        description=(__doc__ or "").strip().split("\n\n")[0],
    )
    p.add_argument("--store-dir", type=store_path, default=Path("./mqstore-data"), help="the store (default ./mqstore-data)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--messages", type=int, default=None, help=f"messages to put (default {DEFAULT_MESSAGES})")
    size.add_argument("--duration", type=float, default=None, metavar="S", help="put for S seconds instead")
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--queues", type=int, default=4, help="queues per topic")
    p.add_argument("--window", type=int, default=32, help="puts in flight per producer")
    p.add_argument("--body-bytes", type=int, default=256)
    p.add_argument("--query", choices=("all", "sample", "none"), default="all",
                   help="find every acknowledged key by query (default), 1000 of them, or none")  # fmt: skip
    p.add_argument("--no-spark", action="store_true", help="skip the Spark stats job")
    p.add_argument("--spark-master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    for name in ("messages", "producers", "queues", "window"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CliError(ExitCode.USAGE, f"--{name} must be at least 1")
    if args.duration is not None and not args.duration > 0:  # (NaN too)
        raise CliError(ExitCode.USAGE, f"--duration must be more than 0 seconds, not {args.duration}")
    if args.body_bytes < 0:
        raise CliError(ExitCode.USAGE, f"--body-bytes must not be negative, not {args.body_bytes}")
    messages = args.messages if args.messages is not None or args.duration is not None else DEFAULT_MESSAGES
    plan = DemoPlan(messages=messages, duration_s=args.duration, producers=args.producers, queues=args.queues,
                    window=args.window, body_bytes=args.body_bytes, query=args.query)  # fmt: skip
    report = run_demo(args.store_dir, plan, config_args=args, spark=not args.no_spark, spark_master=args.spark_master,
                      progress=not args.no_progress)  # fmt: skip
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        _print_report(report, sys.stdout)
    sys.stdout.flush()
    return ExitCode.OK if report["ok"] else ExitCode.FAILURE
