"""Read-side benchmark (not in CI): get throughput in batches of 32 (raw and decoded), query
latency p50/p99, for 1 KiB messages, and the catch-up case: one producer's put rate alone and
while a consumer catches up from offset 0 in another thread (both rates, and the ratio, from
the same run). Prints a table and writes JSON.

    /work/venv/bin/python -m mqstore.bench.bench_read [--messages 100000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from typing import Any

import mqstore
from mqstore import Message

BATCH = 32
BODY = b"v" * 1024


def _fill(store: mqstore.MessageStore, n: int) -> None:
    chunk = 64
    for start in range(0, n, chunk):
        msgs = [Message(topic="bench", body=BODY, keys=[f"key-{i}"]) for i in range(start, min(start + chunk, n))]
        assert store.put_batch(msgs).ok
    assert store.wait_for_messages("bench", 0, n - 1, timeout_s=120)


def _get_rate(store: mqstore.MessageStore, n: int, *, raw: bool) -> float:
    offset, got = 0, 0
    started = time.perf_counter()
    while offset < n:
        result = store.get("bench", 0, offset, min(BATCH, n - offset), raw=raw)
        got += len(result.raw if raw else result.messages)
        offset = result.next_begin_offset
    elapsed = time.perf_counter() - started
    assert got == n, (got, n)
    return n / elapsed


def _query_latencies(store: mqstore.MessageStore, n: int, samples: int) -> list[float]:
    step = max(1, n // samples)
    out = []
    for i in range(0, n, step):
        t = time.perf_counter()
        result = store.query("bench", f"key-{i}", 32)
        out.append(time.perf_counter() - t)
        assert len(result.messages) == 1
    return out


CATCH_UP_SECONDS = 2.0
SMALL_BODY = b"p" * 100


def _producer_rate(store: mqstore.MessageStore, seconds: float, stop: threading.Event | None = None) -> float:
    """Single puts of 100 B bodies to topic "live" for `seconds`: messages per second."""
    message = Message(topic="live", body=SMALL_BODY)
    count = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            assert store.put(message).ok
        count += 100
    elapsed = time.perf_counter() - started
    if stop is not None:
        stop.set()
    return count / elapsed


def _catch_up(store: mqstore.MessageStore, n: int, seconds: float = CATCH_UP_SECONDS) -> dict[str, float]:
    """The case the read path must not spoil: a consumer reading a backlog of `n` messages
    through its own maps (never blocking) while a producer puts single messages."""
    alone = _producer_rate(store, seconds)
    stop = threading.Event()
    consumed = [0]

    def consume() -> None:
        offset = 0
        while not stop.is_set():
            result = store.get("bench", 0, offset, BATCH)
            consumed[0] += len(result.messages)
            offset = result.next_begin_offset if result.next_begin_offset < n else 0
    consumer = threading.Thread(target=consume, name="bench-catch-up-consumer")
    started = time.perf_counter()
    consumer.start()
    try:
        together = _producer_rate(store, seconds, stop)
    finally:
        stop.set()
        consumer.join()
    consumer_rate = consumed[0] / (time.perf_counter() - started)
    return {
        "catch_up_producer_alone_msgs_per_s": round(alone),
        "catch_up_producer_with_consumer_msgs_per_s": round(together),
        "catch_up_consumer_msgs_per_s": round(consumer_rate),
        "catch_up_producer_ratio": round(together / alone, 3),
    }


def run(messages: int, query_samples: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as root:
        store = mqstore.open(root, mapped_file_size_commitlog_bytes=256 << 20)
        try:
            _fill(store, messages)
            _get_rate(store, min(messages, 5000), raw=True)  # warm the maps and caches
            raw = max(_get_rate(store, messages, raw=True) for _ in range(2))
            decoded = max(_get_rate(store, messages, raw=False) for _ in range(2))
            lat = sorted(_query_latencies(store, messages, query_samples))
            catch_up = _catch_up(store, messages)
        finally:
            store.close()
    q = statistics.quantiles(lat, n=100)
    return {
        "messages": messages,
        "body_bytes": len(BODY),
        "batch": BATCH,
        "get_raw_msgs_per_s": round(raw),
        "get_decoded_msgs_per_s": round(decoded),
        "query_p50_ms": round(q[49] * 1000, 3),
        "query_p99_ms": round(q[98] * 1000, 3),
        "query_samples": len(lat),
        **catch_up,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--query-samples", type=int, default=2000)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    figures = run(args.messages, args.query_samples)
    width = max(map(len, figures))
    for key, value in figures.items():
        print(f"{key:<{width}}  {value:>12}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
