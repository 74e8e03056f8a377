"""StoreStats (spec §16): buckets, TPS windows, resets, and the store's wiring."""

from __future__ import annotations

from pathlib import Path

import pykka

import mqstore
from mqstore.messages import Get, GetResult, Put, Reply
from mqstore.stats import BUCKET_NAMES, StoreStats, bucket_of
from mqstore.storage.status import GetMessageStatus, PutMessageStatus


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms


def ok(n: int = 1, wrote: int = 100) -> mqstore.PutResult:
    return mqstore.PutResult(status=PutMessageStatus.PUT_OK, wrote_bytes=wrote, msg_num=n)


def test_latency_buckets_are_rocketmqs_thirteen_with_their_bounds() -> None:
    assert len(BUCKET_NAMES) == 13
    cases = {0: 0, 1: 1, 9: 1, 10: 2, 49: 2, 50: 3, 99: 3, 100: 4, 199: 4, 200: 5, 499: 5, 500: 6, 999: 6,
             1000: 7, 1999: 7, 2000: 8, 3000: 9, 4000: 10, 4999: 10, 5000: 11, 9999: 11, 10000: 12, 99999: 12}  # fmt: skip
    assert {ms: bucket_of(ms) for ms in cases} == cases
    assert bucket_of(-5) == 0


def test_puts_count_per_topic_and_failures_by_status() -> None:
    stats = StoreStats(Clock())
    stats.record_put("a", ok(wrote=100), 500_000)  # 0.5 ms: the <=0ms bucket
    stats.record_put("a", ok(n=3, wrote=300), 12_000_000)  # a batch of 3, 12 ms
    stats.record_put("b", ok(wrote=50), 1_000_000)
    stats.record_put("b", mqstore.PutResult(status=PutMessageStatus.MESSAGE_ILLEGAL), 2_000_000)
    stats.record_put("b", TimeoutError("no answer"), 3_000_000)
    snap = stats.snapshot()
    assert snap["put_topic"] == {"a": {"messages": 4, "bytes": 400}, "b": {"messages": 1, "bytes": 50}}
    assert snap["put_message_times_total"] == 5
    assert snap["put_message_size_total"] == 450
    assert snap["put_message_failed_times"] == 2
    assert snap["put_message_status_times"] == {"PUT_OK": 3, "MESSAGE_ILLEGAL": 1, "TimeoutError": 1}
    assert snap["put_message_entire_time_max_ms"] == 12.0
    dist = snap["put_message_distribute_time"]
    assert dist["<=0ms"] == 1 and dist["0~10ms"] == 3 and dist["10~50ms"] == 1
    assert sum(dist.values()) == 5


def test_gets_count_found_miss_and_transferred_messages() -> None:
    stats = StoreStats(Clock())
    stats.record_get(GetResult(status=GetMessageStatus.FOUND, raw=(b"x", b"y", b"z")), 1_000)
    stats.record_get(GetResult(status=GetMessageStatus.OFFSET_OVERFLOW_ONE), 7_000_000)
    snap = stats.snapshot()
    assert snap["get_message_times_total_found"] == 1
    assert snap["get_message_times_total_miss"] == 1
    assert snap["get_message_transfered_msg_count"] == 3
    assert snap["get_message_entire_time_max_ms"] == 7.0


def test_put_tps_over_10_60_600_second_windows_from_one_second_samples() -> None:
    clock = Clock()
    stats = StoreStats(clock)
    # 100 puts per second for 70 seconds, then 10 s with nothing.
    for _ in range(70):
        for _ in range(100):
            stats.record_put("t", ok(), 1000)
        clock.now_ms += 1000
        assert stats.sample(clock.now_ms)
    tps = stats.put_tps()
    assert tps["10s"] == 100.0 and tps["60s"] == 100.0
    assert tps["600s"] == 100.0  # fewer than 600 s of samples: from the oldest one
    clock.now_ms += 10_000
    tps = stats.put_tps()
    assert tps["10s"] == 0.0
    assert round(tps["60s"], 1) == round(50 * 100 / 60, 1)


def test_sample_at_most_once_a_second_and_buckets_reset_every_60_s() -> None:
    clock = Clock()
    stats = StoreStats(clock)
    assert not stats.sample(clock.now_ms + 999)
    assert stats.sample(clock.now_ms + 1000)
    stats.record_put("t", ok(), 1000)
    clock.now_ms += 61_000
    stats.sample(clock.now_ms)
    snap = stats.snapshot()
    assert sum(snap["put_message_distribute_time"].values()) == 0  # reset after the 60 s log
    assert sum(snap["put_message_distribute_time_total"].values()) == 1  # the running total stays


def test_store_records_embedded_and_actor_puts_and_gets(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s") as store:
        for i in range(10):
            assert store.put(mqstore.Message(topic="T", body=b"x" * 10, queue_id=i % 2)).ok
        assert store.put_batch([mqstore.Message(topic="U", body=b"y") for _ in range(3)]).ok
        future: pykka.ThreadingFuture = pykka.ThreadingFuture()
        store.actor_ref.tell(Put(messages=(mqstore.Message(topic="U", body=b"z"),), reply=Reply(future=future)))
        assert future.get(timeout=10).ok
        assert store.get("T", 0, 0, 32).found
        assert not store.get("T", 0, 99, 32).found
        got: pykka.ThreadingFuture = pykka.ThreadingFuture()
        store.actor_ref.tell(Get(topic="T", queue_id=1, offset=0, max_count=2, reply=Reply(future=got)))
        assert got.get(timeout=10).found
        snap = store.stats()
    assert snap["put_topic"]["T"]["messages"] == 10
    assert snap["put_topic"]["U"]["messages"] == 4
    assert snap["put_message_failed_times"] == 0
    assert snap["get_message_times_total_found"] == 2
    assert snap["get_message_times_total_miss"] == 1
    assert snap["get_message_transfered_msg_count"] == 5 + 2
    assert snap["dispatch_behind_bytes"] is not None and snap["dispatch_behind_bytes"] >= 0
    assert snap["process"]["rss_bytes"] > 0 and snap["process"]["open_files"] >= 1
    assert snap["disk"]["commitlog"]["store_allocated_bytes"] > 0
    assert 0 <= snap["commitlog_disk_ratio"] <= 1
