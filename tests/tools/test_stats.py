"""StoreStats (spec §16): buckets, TPS windows, resets, and the store's wiring."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import typing
from pathlib import Path

import msgpack
import pykka
import pytest

import mqstore
from mqstore import supervisor as supervisor_module
from mqstore.cli import main
from mqstore.messages import Get, GetResult, Put, Reply
from mqstore.stats import (BUCKET_NAMES, SNAPSHOT_FILE_NAME, TPS_WINDOWS_S, Rates, StoreStats, StoreStatsSnapshot, bucket_of,
                           read_snapshot)
from mqstore.tools import inspect_cli
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


def test_stats_has_every_key_of_its_typed_dict_running_or_given_up(tmp_path: Path) -> None:
    """Review 73 M4: `stats()` is typed key by key (StoreStatsSnapshot), so the keys it answers
    are the TypedDict's, every time: the log's end and reput's offset were missing once the
    supervisor gave up (a monitor's `stats()["reput_offset"]` raised KeyError in the state it
    watches for); they are None then, like the lags."""
    expected = set(typing.get_type_hints(StoreStatsSnapshot))
    assert {"commitlog_max_offset", "reput_offset", "dispatch_behind_bytes", "commitlog_disk_ratio"} <= expected
    with mqstore.open(tmp_path / "s") as store:
        assert store.put(mqstore.Message(topic="T", body=b"x")).ok
        wait_for(lambda: (store.stats()["commitlog_max_offset"] or 0) > 0)  # the read view, published after the answer
        running = store.stats()
        store.supervisor._give_up(RuntimeError("an actor kept failing"))  # noqa: SLF001
        given_up = store.stats()
    assert set(running) == expected and set(given_up) == expected
    assert set(running["put_tps"]) == set(typing.get_type_hints(Rates)) == {f"{w}s" for w in TPS_WINDOWS_S}
    assert running["commitlog_max_offset"] is not None and running["commitlog_max_offset"] > 0
    for key in ("commitlog_max_offset", "reput_offset", "dispatch_behind_bytes", "consume_queue_behind_bytes",
                "index_behind_bytes"):  # fmt: skip
        assert given_up[key] is None, key
    assert given_up["put_topic"]["T"] == {"messages": 1, "bytes": running["put_message_size_total"]}


# ---------------------------------------------------------------------------------------------
# on the ticker: sampling, the 60 s log, the snapshot file, `mqstore stats` on a running store


def wait_for(predicate, timeout_s: float = 10.0):  # type: ignore[no-untyped-def]
    """Poll a condition of another thread's making (a file the ticker writes), bounded."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def fast_ticker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tick hooks every 20 ms instead of every second, so a test waits milliseconds."""
    monkeypatch.setattr(supervisor_module, "TICK_HOOK_INTERVAL_MS", 20)


def test_every_60_s_sample_logs_put_tps_buckets_and_get_found_miss_at_info(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    stats = StoreStats(clock)
    for _ in range(3):
        stats.record_put("t", ok(), 2_000_000)
    stats.record_get(GetResult(status=GetMessageStatus.FOUND, raw=(b"x",)), 1_000)
    stats.record_get(GetResult(status=GetMessageStatus.NO_MATCHED_MESSAGE), 1_000)
    with caplog.at_level(logging.INFO, logger="mqstore"):
        for _ in range(60):
            clock.now_ms += 1000
            stats.sample(clock.now_ms)
    logged = [r for r in caplog.records if r.getMessage() == "store stats"]
    assert len(logged) == 1 and logged[0].levelno == logging.INFO
    event = logged[0].mqstore_event
    assert set(event["put_tps"]) == {"10s", "60s", "600s"}
    assert event["put_distribution"]["0~10ms"] == 3 and set(event["put_distribution"]) == set(BUCKET_NAMES)
    assert (event["get_found"], event["get_miss"]) == (1, 1)
    assert set(event["get_found_tps"]) == set(event["get_miss_tps"]) == {"10s", "60s", "600s"}


def test_the_supervisor_ticker_samples_the_stats_every_tick_and_survives_a_failing_hook(
    tmp_path: Path, fast_ticker: None, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []
    reached = threading.Event()

    def broken(_now_ms: int) -> None:
        raise RuntimeError("a broken hook")

    def counting(now_ms: int) -> None:
        calls.append(now_ms)
        if len(calls) >= 5:
            reached.set()

    with mqstore.open(tmp_path / "s") as store:
        store.supervisor.ctx.on_tick_ms[:0] = [broken]  # before the others: it must not stop them
        store.supervisor.ctx.on_tick_ms.append(counting)
        assert reached.wait(10), calls
        assert store.supervisor._thread is not None and store.supervisor._thread.is_alive()
        assert store.put(mqstore.Message(topic="T", body=b"x")).ok  # the store still works
        # Nobody reads the stats: only the ticker can take the second sample (a second later).
        wait_for(lambda: len(store.stats_service._samples) >= 2)  # noqa: SLF001 - the ticker's effect
    failures = [r for r in caplog.records if r.getMessage() == "tick hook failed"]
    assert len(failures) == 1  # failing every tick, logged once a minute


def test_a_store_with_a_short_interval_writes_its_snapshot_within_an_interval(tmp_path: Path, fast_ticker: None) -> None:
    root = tmp_path / "s"
    with mqstore.open(root, stats_snapshot_interval_ms=100) as store:
        for i in range(10):
            assert store.put(mqstore.Message(topic="T", body=b"x" * 10, queue_id=i % 2)).ok
        put_at = time.monotonic()
        snap = wait_for(lambda: (s := read_snapshot(root)) and s["stats"]["put_message_times_total"] == 10 and s)
        assert time.monotonic() - put_at < 2.0  # an interval plus a few ticks, with a margin
        raw = (root / SNAPSHOT_FILE_NAME).read_bytes()
        assert msgpack.unpackb(raw, raw=False) == snap
        assert snap["pid"] == os.getpid() and snap["final"] is False and snap["interval_ms"] == 100
        assert snap["stats"]["put_topic"] == {"T": {"messages": 10, "bytes": snap["stats"]["put_message_size_total"]}}
        assert snap["dispatch"]["commitlog_max_offset"] > 0 and snap["dispatch"]["behind_bytes"] >= 0
        assert abs(snap["timestamp_ms"] - time.time() * 1000) < 10_000
    last = read_snapshot(root)
    assert last is not None and last["final"] is True and last["stats"]["put_message_times_total"] == 10


def test_a_wall_clock_stepped_back_does_not_hold_the_snapshots(tmp_path: Path, fast_ticker: None) -> None:
    """Snapshots are paced by the monotonic ticker: paced by the wall clock, a clock stepped
    back an hour wrote none for an hour."""
    root = tmp_path / "s"
    wall = [int(time.time() * 1000)]
    with mqstore.open(root, stats_snapshot_interval_ms=100, clock_ms=lambda: wall[0]) as store:
        wait_for(lambda: read_snapshot(root) is not None)
        wall[0] -= 3_600_000
        assert store.put(mqstore.Message(topic="T", body=b"x")).ok
        snap = wait_for(lambda: (s := read_snapshot(root)) and s["stats"]["put_message_times_total"] == 1 and s)
        assert snap["timestamp_ms"] == wall[0]


def test_mqstore_stats_on_a_running_store_shows_the_live_figures_and_their_age(
    tmp_path: Path, fast_ticker: None, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "s"
    store = mqstore.open(root, stats_snapshot_interval_ms=100)
    try:
        for _ in range(20):
            assert store.put(mqstore.Message(topic="Live", body=b"y" * 32)).ok
        assert store.get("Live", 0, 0, 32).found
        wait_for(lambda: (s := read_snapshot(root)) and s["stats"]["get_message_times_total_found"] == 1)
        code = main(["stats", str(root), "--json"])
        out, _ = capsys.readouterr()
        assert code == 0
        report = json.loads(out)
        assert report["running"] is True
        snap = report["snapshot"]
        assert snap["source"] == "live" and snap["pid"] == os.getpid() and not snap["stale"]
        assert 0 <= snap["age_ms"] < 5_000
        assert snap["stats"]["put_message_times_total"] == 20
        assert snap["stats"]["get_message_times_total_found"] == 1
        code = main(["stats", str(root)])
        text, _ = capsys.readouterr()
        assert code == 0 and "the store is running" in text
        assert f"live figures (pid {os.getpid()}'s snapshot, written" in text and " ago" in text
        assert "puts: 20 messages" in text and "gets: 1 found" in text
    finally:
        store.close()
    code = main(["stats", str(root)])
    text, _ = capsys.readouterr()
    assert code == 0 and "last run's figures" in text and "at its close" in text and "live figures" not in text


def test_a_snapshot_left_by_a_dead_process_is_the_last_runs_not_live(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / "commitlog").mkdir()
    document = {"format": 1, "pid": 999_999_999, "timestamp_ms": 1_000, "interval_ms": 10_000, "final": False,
                "store_dir": str(root), "dispatch": {}, "rss_bytes": 1, "stats": {}}  # fmt: skip
    (root / SNAPSHOT_FILE_NAME).write_bytes(msgpack.packb(document, use_bin_type=True))
    lock = inspect_cli.lock_state(root)
    view = inspect_cli.snapshot_view(root, lock, now_ms=61_000)
    assert view is not None and view["source"] == "last run" and view["age_ms"] == 60_000 and not view["stale"]
    held = {**lock, "held": True, "holder_pid": 999_999_999}
    assert inspect_cli.snapshot_view(root, held, now_ms=61_000)["stale"] is True  # live, 6 intervals old
    (root / SNAPSHOT_FILE_NAME).write_bytes(b"\xc1 not msgpack")
    assert "not a msgpack snapshot" in inspect_cli.snapshot_view(root, lock)["error"]


def test_a_pass_recorded_at_once_counts_as_its_puts_one_by_one() -> None:
    """record_puts (one lock per writer pass) gives the figures record_put gives per put."""
    puts: list[tuple[str, mqstore.PutResult | BaseException, int]] = [
        ("a", ok(wrote=100), 500_000),
        ("a", ok(n=3, wrote=300), 12_000_000),
        ("b", ok(n=0, wrote=50), 1_000_000),
        ("b", mqstore.PutResult(status=PutMessageStatus.MESSAGE_ILLEGAL), 2_000_000),
        ("b", mqstore.PutResult(status=PutMessageStatus.FLUSH_DISK_TIMEOUT, wrote_bytes=9, msg_num=1), 10_000_000),
        ("c", TimeoutError("no answer"), 20_000_000_000),
        ("c", ok(), 999_999),
    ]
    one_by_one, at_once = StoreStats(Clock()), StoreStats(Clock())
    for topic, result, latency_ns in puts:
        one_by_one.record_put(topic, result, latency_ns)
    at_once.record_puts(puts[:3])
    at_once.record_puts([])
    at_once.record_puts(puts[3:])
    assert at_once.snapshot() == one_by_one.snapshot()
    assert at_once.snapshot()["put_message_status_times"] == {"PUT_OK": 4, "MESSAGE_ILLEGAL": 1,
                                                                "FLUSH_DISK_TIMEOUT": 1, "TimeoutError": 1}  # fmt: skip


def test_a_supervisor_given_up_from_another_thread_ticks_no_hook_again(tmp_path: Path, fast_ticker: None) -> None:
    """The supervisor's thread ended when it gave up itself, but one given up from elsewhere
    went on running the tick hooks (the stats snapshot, the offsets) after its lock was given
    up: the CI run saw a test's stats ticker writing into a later test's log."""
    calls: list[int] = []
    with mqstore.open(tmp_path / "s") as store:
        store.supervisor.ctx.on_tick_ms.append(calls.append)
        wait_for(lambda: len(calls) >= 2)
        store.supervisor._give_up(RuntimeError("an actor kept failing"))  # noqa: SLF001
        thread = store.supervisor._thread  # noqa: SLF001
        assert thread is not None
        thread.join(5)
        assert not thread.is_alive()
        seen = len(calls)
        time.sleep(0.2)  # ten hook intervals
        assert len(calls) == seen


def test_clean_unused_topic_forgets_the_topics_per_topic_figures(tmp_path: Path) -> None:
    """Review 76: a topic's put figures stayed after clean_unused_topic removed its queues, so
    a host with a topic per session grew them (and every stats snapshot) without bound."""
    with mqstore.open(tmp_path / "s") as store:
        for round_ in range(3):
            for i in range(50):
                assert store.put(mqstore.Message(topic=f"session-{round_}-{i}", body=b"x")).ok
            assert store.put(mqstore.Message(topic="kept", body=b"y")).ok
            assert store.max_offset("kept", 0) == round_ + 1  # dispatched (this thread's reads cover its puts)
            assert store.clean_unused_topic(["kept"]) == 50
            assert set(store.stats()["put_topic"]) == {"kept"}
        assert store.stats()["put_topic"]["kept"]["messages"] == 3
        assert store.stats()["put_message_times_total"] == 153  # the totals stay


def test_disk_usage_of_nested_directories_looks_at_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stats() walked the root and then each of its store directories again (every queue's
    files stat'ed twice: 602 ms at 12k queues, review 84 F9). One walk gives each directory
    what a walk of its own gives, links to directories not followed, links to files followed."""
    from mqstore import stats as stats_module

    root = tmp_path / "store"
    (root / "commitlog").mkdir(parents=True)
    (root / "consumequeue" / "t" / "0").mkdir(parents=True)
    (root / "index").mkdir()
    (root / "commitlog" / "00000000000000000000").write_bytes(b"c" * 9000)
    (root / "consumequeue" / "t" / "0" / "00000000000000000000").write_bytes(b"q" * 100)
    (root / "index" / "20261130000000000").write_bytes(b"i" * 5000)
    (root / "checkpoint").write_bytes(b"k" * 4096)
    (root / "consumequeue" / "loop").symlink_to(root)  # a walk following it would never end
    (root / "index" / "outside").symlink_to(root / "checkpoint")
    (root / "index" / "dangling").symlink_to(root / "gone")
    paths = {"root": str(root), "commitlog": str(root / "commitlog"), "consumequeue": str(root / "consumequeue"),
             "index": str(root / "index")}  # fmt: skip

    def walked(path: str) -> tuple[int, int]:
        allocated = apparent = 0
        for dirpath, _dirs, files in os.walk(path):
            for name in files:
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except OSError:
                    continue
                allocated += st.st_blocks * 512
                apparent += st.st_size
        return allocated, apparent

    scans = 0
    real_scandir = os.scandir

    def counting_scandir(path: str) -> typing.Any:
        nonlocal scans
        scans += 1
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    found = stats_module.disk_allocated_bytes_under(paths)
    assert scans == 6  # root, commitlog, consumequeue, consumequeue/t, consumequeue/t/0, index: once each
    monkeypatch.undo()
    assert found == {name: walked(path) for name, path in paths.items()}
    assert found["root"][1] == 9000 + 100 + 5000 + 4096 + 4096  # (the link to the checkpoint counts it again)
    assert stats_module.disk_allocated_bytes(root / "index") == walked(str(root / "index"))


def test_disk_usage_of_a_store_directory_that_is_a_link_to_another_disk(tmp_path: Path) -> None:
    """Review 88 F3: `commitlog` a link to a directory on another disk (RocketMQ's common
    layout): the one walk of the root did not follow it and counted it 0 bytes. A directory the
    walk did not enter is walked from itself, as a walk of its own would."""
    from mqstore import stats as stats_module

    root, other = tmp_path / "store", tmp_path / "other"
    (root / "index").mkdir(parents=True)
    (other / "commitlog").mkdir(parents=True)
    (other / "cq" / "t" / "0").mkdir(parents=True)
    (root / "index" / "f").write_bytes(b"i" * 8192)
    (other / "commitlog" / "00000000000000000000").write_bytes(b"c" * 65536)
    (other / "cq" / "t" / "0" / "00000000000000000000").write_bytes(b"q" * 20000)
    (root / "commitlog").symlink_to(other / "commitlog")
    (root / "consumequeue").symlink_to(other / "cq")
    paths = {name: str(root / sub) for name, sub in (("root", ""), ("commitlog", "commitlog"),
                                                     ("consumequeue", "consumequeue"), ("index", "index"))}  # fmt: skip
    found = stats_module.disk_allocated_bytes_under(paths)
    assert [found[n][1] for n in ("root", "commitlog", "consumequeue", "index")] == [8192, 65536, 20000, 8192]
    assert found == {name: stats_module.disk_allocated_bytes(path) for name, path in paths.items()}


def test_rates_count_the_monotonic_clock_whatever_the_wall_clock_does() -> None:
    """Review 109 K4: samples were paced by the wall clock; stepped back an hour, no sample was
    taken for that hour and every rate read 0.0 while puts were taken."""
    wall, elapsed = [2_000_000_000_000], [0]
    stats = StoreStats(lambda: wall[0], elapsed_ms=lambda: elapsed[0])
    for second in range(1, 21):
        if second == 5:
            wall[0] -= 3_600_000
        wall[0] += 1_000
        elapsed[0] += 1_000
        stats.record_put("t", ok(), 1_000_000)
        stats.sample()
    assert stats.put_tps()["10s"] == pytest.approx(1.0)
    snapshot = stats.snapshot()
    assert snapshot["runtime_ms"] == 20_000 and snapshot["boot_timestamp_ms"] == 2_000_000_000_000


def test_a_flush_disk_timeout_put_counts_as_stored_not_as_failed() -> None:
    """Review 139 F2: FLUSH_DISK_TIMEOUT (stored, not known to be on disk; isOk() in Java)
    counted as a failed put, its messages missing from the topic's and the store's totals."""
    stats = StoreStats(Clock())
    stats.record_put("t", ok(wrote=100), 1_000_000)
    stats.record_put("t", mqstore.PutResult(status=PutMessageStatus.FLUSH_DISK_TIMEOUT, wrote_bytes=9, msg_num=1), 1_000_000)
    stats.record_put("t", mqstore.PutResult(status=PutMessageStatus.MESSAGE_ILLEGAL), 1_000_000)
    snap = stats.snapshot()
    assert snap["put_message_failed_times"] == 1
    assert snap["put_message_times_total"] == 2 and snap["put_message_size_total"] == 109
    assert snap["put_message_status_times"] == {"PUT_OK": 1, "FLUSH_DISK_TIMEOUT": 1, "MESSAGE_ILLEGAL": 1}
