"""query reads index/ through the caller's own read-only maps (IndexReader), not by asking the
index actor: the same answers as the actor's, read-your-writes, safe beside a writing owner,
and no maps left behind when the owner deletes files, restarts or the store closes."""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pykka
import pytest

import mqstore
from mqstore import FaultPlan, Message, MessageStore
from mqstore.actors import cleaner as cleaner_module
from mqstore.messages import DeleteExpiredIndexFiles, QueryOffsets, QueryResult, Reply
from mqstore.storage.disk import FixedDiskGauge
from mqstore.storage.fs import SimulatedFileSystem
from mqstore import reads
from mqstore.storage.index import (
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    IndexReader,
    IndexService,
    key_hash_and_slot,
)

h = sys.modules["mqstore_read_test_helpers"]
Open = Callable[..., MessageStore]
# Small index files: a few hundred puts roll many of them, and chains share slots.
SMALL_INDEX = {"max_index_num": 24, "max_hash_slot_num": 7}
WAIT_S = 10.0

ManualClock, T0 = h.ManualClock, h.T0


class AskCounter:
    """Counts the store's questions to the index actor (the path the direct reads avoid)."""

    def __init__(self, store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.index_asks = 0
        real_ask = store._ask

        def counting_ask(peer: str, message: Any) -> Any:
            if peer == "index":
                self.index_asks += 1
            return real_ask(peer, message)

        monkeypatch.setattr(store, "_ask", counting_ask)



def query_via_actor(store: MessageStore, monkeypatch: pytest.MonkeyPatch, *args: Any) -> QueryResult:
    """The query as it was before the direct path: every lookup asks the index actor."""
    with monkeypatch.context() as m:
        m.setattr(reads.ThreadReaders, "index_reader", lambda self, view: None)
        return store.query(*args)


def thread_index_reader(store: MessageStore) -> IndexReader:
    reader = store._readers.get()._index
    assert reader is not None, "this thread's query did not use the direct path"
    return reader


def index_names(root: Path) -> tuple[str, ...]:
    return tuple(sorted(os.listdir(root / "index")))


def wait_indexed(store: MessageStore, end_offset: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while (p := store.read_view.view).indexed_end < end_offset:
        assert time.monotonic() < deadline, f"index did not reach {end_offset}: {p}"
        time.sleep(0.001)


def index_one(service: IndexService, offset: int, keys: str) -> None:
    assert service.build_index(
        topic="T", commitlog_offset=offset, store_timestamp=T0, sys_flag=0, keys=keys, uniq_key=None
    )


def set_prev_index(f: Any, entries_pos: int, entry_no: int, prev: int) -> None:
    at = entries_pos + entry_no * INDEX_ENTRY_SIZE + 16  # keyHash 4, phyOffset 8, timeDiff 4
    f._buf[at : at + 4] = prev.to_bytes(4, "big")


def put_ok(store: MessageStore, key_list: list[str], topic: str = "T") -> Any:
    result = store.put(Message(topic=topic, body=f"body-{key_list[0]}".encode(), keys=key_list))
    assert result.ok, result
    return result


# -- equality with the actor's answers ---------------------------------------------------------


def test_direct_query_answers_exactly_as_the_index_actor_across_roll_overs_windows_and_counts(
    tmp_path: Path, open_store: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(20261122)
    clock = ManualClock()
    store = open_store(clock_ms=clock, **SMALL_INDEX)
    keys = [f"k{i}" for i in range(25)]
    counter = AskCounter(store, monkeypatch)
    compared = 0

    def compare_one() -> None:
        nonlocal compared
        key = rng.choice(keys + ["absent"])
        topic = rng.choice(("T", "T", "U", "Nope"))
        max_count = rng.choice((1, 2, 5, 32, 64, 100))
        if rng.random() < 0.3:
            begin, end = 0, 2**63 - 1
        else:
            begin = T0 + rng.randrange(-2_000, 100_000)
            end = begin + rng.randrange(0, 40_000)
        direct = store.query(topic, key, max_count, begin, end)
        asks_before = counter.index_asks
        via_actor = query_via_actor(store, monkeypatch, topic, key, max_count, begin, end)
        assert counter.index_asks > asks_before  # the reference really asked the actor
        assert direct == via_actor, (topic, key, max_count, begin, end)
        # The offsets themselves, order and header fields included, not only the records.
        found = thread_index_reader(store).query_offset(topic, key, max_count, begin, end)
        question = QueryOffsets(topic=topic, key=key, max_num=max_count, begin_ms=begin, end_ms=end)
        reply = store._ask("index", question)
        assert found is not None
        assert tuple(found.phy_offsets) == reply.offsets
        assert (found.index_last_update_timestamp, found.index_last_update_phy_offset) == (
            reply.last_update_timestamp,
            reply.last_update_phy_offset,
        )
        compared += 1

    for i in range(400):
        clock.now_ms = T0 + i * 250  # four puts a second: windows cut through seconds
        picked = rng.sample(keys, rng.choice((1, 1, 2, 3)))
        topic = "T" if rng.random() < 0.8 else "U"
        put_ok(store, picked, topic)
        if i % 7 == 0:  # also while the newest file, mapped already, is still filling
            compare_one()
    assert len(index_names(tmp_path / "store")) >= 20  # ~700 keys in files of 23 entries
    for _ in range(300):
        compare_one()
    assert compared == 358
    # Some answers were non-trivial, and the direct queries asked nothing.
    assert store.query("T", "k1", 64).messages
    direct_asks = counter.index_asks
    store.query("T", "k2")
    assert counter.index_asks == direct_asks
    assert thread_index_reader(store).mapped_names == index_names(tmp_path / "store")


def test_reader_follows_chains_past_a_header_the_owner_has_not_rewritten_yet() -> None:
    """The owner writes entry, slot, then header; a reader that trusted the header's count
    would drop a whole chain whose head is newer than the header it read."""
    fs = SimulatedFileSystem()
    service = IndexService(fs, "/s/index", clock_ms=lambda: T0, max_hash_slot_num=1, max_index_num=10)
    index_one(service, 100, "a")
    f = service.files[0]
    header_after_one = bytes(f._buf[:INDEX_HEADER_SIZE])
    for offset, key in ((200, "b"), (300, "a")):
        index_one(service, offset, key)
    f._buf[:INDEX_HEADER_SIZE] = header_after_one  # the header as a reader may still see it
    reader = IndexReader(fs, "/s/index", max_hash_slot_num=1, max_index_num=10)
    assert reader.sync((f.name,))
    found = reader.query_offset("T", "a", 32, 0, 2**63 - 1)
    assert found is not None and found.phy_offsets == [300, 100]


def test_reader_walks_of_corrupt_slots_and_chains_end_without_error() -> None:
    fs = SimulatedFileSystem()
    slots, entries = 3, 10
    service = IndexService(fs, "/s/index", clock_ms=lambda: T0, max_hash_slot_num=slots, max_index_num=entries)
    for offset in (100, 200, 300):
        index_one(service, offset, "a")
    f = service.files[0]
    _hash, slot = key_hash_and_slot("T#a", slots)
    entries_pos = INDEX_HEADER_SIZE + slots * 4
    reader = IndexReader(fs, "/s/index", max_hash_slot_num=slots, max_index_num=entries)
    assert reader.sync((f.name,))
    # A cycle 3 -> 2 -> 3 -> ...: the walk is bounded.
    set_prev_index(f, entries_pos, 2, 3)
    found = reader.query_offset("T", "a", 10**6, 0, 2**63 - 1)
    assert found is not None and len(found.phy_offsets) <= entries
    # Slot values and chain links outside the file are not followed.
    for bad in (entries, 2**31 - 1, -5):
        f._buf[INDEX_HEADER_SIZE + slot * 4 : INDEX_HEADER_SIZE + slot * 4 + 4] = bad.to_bytes(4, "big", signed=True)
        found = reader.query_offset("T", "a", 32, 0, 2**63 - 1)
        assert found is not None and found.phy_offsets == []
    f._buf[INDEX_HEADER_SIZE + slot * 4 : INDEX_HEADER_SIZE + slot * 4 + 4] = (3).to_bytes(4, "big")
    set_prev_index(f, entries_pos, 3, 10**6)
    found = reader.query_offset("T", "a", 32, 0, 2**63 - 1)
    assert found is not None and found.phy_offsets == [300]


# -- read-your-writes and concurrency ----------------------------------------------------------


def run_threads(targets: list[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # reported to the test below
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guarded(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


def test_each_thread_finds_what_it_just_put(open_store: Open) -> None:
    store = open_store(**SMALL_INDEX)

    def put_then_query(t: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(150):
                key = f"t{t}-{i}"
                result = put_ok(store, [key, "shared"])
                found = store.query("T", key)
                assert [m.commitlog_offset for m in found.messages] == [result.commitlog_offset], key
            thread_index_reader(store)  # the direct path answered

        return run

    errors = run_threads([put_then_query(t) for t in range(4)])
    assert not errors, errors[:3]


def test_a_query_finds_what_dispatch_reported_before_it_even_from_a_thread_that_did_not_put(
    open_store: Open,
) -> None:
    """A question to the actor queued behind every dispatch sent before it; the direct path
    waits for the index to cover what dispatch reported (here the index publishes late)."""
    store = open_store(**SMALL_INDEX)
    publish = store.read_view.publish_index

    def publish_late(files: tuple[str, ...], indexed_end: int) -> None:
        time.sleep(0.05)
        publish(files, indexed_end)

    store.read_view.publish_index = publish_late  # type: ignore[method-assign]
    for i in range(4):
        results: list[Any] = []
        assert not run_threads([lambda: results.append(put_ok(store, [f"x{i}"]))])
        assert store.wait_for_messages("T", 0, results[0].queue_offset, timeout_s=WAIT_S)
        found = store.query("T", f"x{i}")
        assert [m.commitlog_offset for m in found.messages] == [results[0].commitlog_offset]
    thread_index_reader(store)


def test_queries_beside_puts_and_roll_overs_find_every_key_indexed_before_them(
    tmp_path: Path, open_store: Open
) -> None:
    """Everything below the published indexed_end must be found, whatever the owner is writing."""
    store = open_store(max_index_num=40, max_hash_slot_num=5)
    acked: list[tuple[str, int, int]] = []  # (key, commitlog offset, end offset)
    lock = threading.Lock()
    stop = threading.Event()
    checked = [0]

    def producer(t: int) -> Callable[[], None]:
        def run() -> None:
            try:
                for i in range(250):  # ~1000 index keys: ~25 files of 39 entries
                    key = f"p{t}-{i}"
                    result = put_ok(store, [key, f"hot{i % 3}"])
                    with lock:
                        acked.append((key, result.commitlog_offset, result.commitlog_offset + result.wrote_bytes))
            finally:
                stop.set()

        return run

    def querier() -> None:
        rng = random.Random(5)
        while not stop.is_set() or checked[0] == 0:
            with lock:
                candidates = list(acked)
            progress = store.read_view.view
            if progress.index_files is None:
                continue
            covered = [a for a in candidates if a[2] <= progress.indexed_end]
            for key, offset, _end in rng.sample(covered, min(20, len(covered))):
                found = store.query("T", key)
                assert [m.commitlog_offset for m in found.messages] == [offset], (key, progress)
                checked[0] += 1
            store.query("T", rng.choice(("hot0", "hot1", "hot2")), 64)

    errors = run_threads([producer(0), producer(1), querier, querier])
    assert not errors, errors[:3]
    assert checked[0] > 0
    assert len(index_names(tmp_path / "store")) > 10
    key, offset, end = acked[-1]
    wait_indexed(store, end)
    assert [m.commitlog_offset for m in store.query("T", key).messages] == [offset]


# -- files deleted, owner restarted, store closed ----------------------------------------------


def delete_index_files_below(store: MessageStore, head: int) -> int:
    """The cleaner's request to the index actor, as after the commitlog's head moved to `head`:
    how many index files it deleted (at least 3 in these tests' stores)."""
    waiter: pykka.ThreadingFuture[int] = pykka.ThreadingFuture()
    store.supervisor.ctx.peers["index"].tell(DeleteExpiredIndexFiles(min_phy_offset=head, reply=Reply(future=waiter)))
    deleted = waiter.get(timeout=WAIT_S)
    assert deleted >= 3
    return deleted


def test_files_the_owner_deletes_are_unmapped_and_queries_still_answer_as_the_actor(
    tmp_path: Path, open_store: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(**SMALL_INDEX)
    results = [put_ok(store, [f"k{i}", "all"]) for i in range(120)]
    store.query("T", "k0")
    reader = thread_index_reader(store)
    before = reader.mapped_names
    assert len(before) >= 8 and before == index_names(tmp_path / "store")
    held = {name: reader._by_name[name] for name in before}
    deleted = delete_index_files_below(store, results[60].commitlog_offset)
    remaining = index_names(tmp_path / "store")
    assert len(remaining) == len(before) - deleted
    for i in (0, 30, 59, 60, 90, 119):
        assert store.query("T", f"k{i}") == query_via_actor(store, monkeypatch, "T", f"k{i}")
    assert [m.commitlog_offset for m in store.query("T", "k119").messages] == [results[119].commitlog_offset]
    assert store.query("T", "all", 64) == query_via_actor(store, monkeypatch, "T", "all", 64)
    assert reader.mapped_names == remaining
    for name, f in held.items():
        assert f._region.buf.closed == (name not in remaining), name


def deleted_index_maps(root: Path) -> int:
    """Maps of this process of index files deleted from root/index (their blocks not freed)."""
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if str(root / "index") in line and "(deleted)" in line)


def test_an_idle_threads_maps_of_deleted_index_files_are_given_back_from_another_thread(
    tmp_path: Path, open_store: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 46 M5 for index/: a host thread that queried once and went idle kept its maps of
    the index files the cleaner deleted (each up to ~420 MB of blocks at the default sizes)
    until it queried again. The store's tick hook gives them back from any thread, only those
    whose files are gone; the idle thread's next queries answer as the actor."""
    store = open_store(**SMALL_INDEX)
    results = [put_ok(store, [f"k{i}", "all"]) for i in range(120)]
    wait_indexed(store, results[-1].commitlog_offset + results[-1].wrote_bytes)
    queried, resume = threading.Event(), threading.Event()
    readers: list[IndexReader] = []
    answers: list[QueryResult] = []

    def idle_host_thread() -> None:
        answers.append(store.query("T", "k0"))
        readers.append(thread_index_reader(store))
        queried.set()
        resume.wait(WAIT_S)
        answers.extend(store.query("T", f"k{i}") for i in (0, 59, 60, 119))
        answers.append(store.query("T", "all", 64))

    thread = threading.Thread(target=idle_host_thread)
    thread.start()
    try:
        assert queried.wait(WAIT_S) and answers[0].messages
        reader = readers[0]
        before = reader.mapped_names
        assert len(before) >= 8 and before == index_names(tmp_path / "store")
        held = {name: reader._by_name[name] for name in before}
        delete_index_files_below(store, results[60].commitlog_offset)
        remaining = index_names(tmp_path / "store")
        # A listing older than a file is no reason to unmap it: only a file that is gone goes.
        assert store._readers.index_maps.release_deleted(set(before) - {remaining[-1]}) == 0
        assert not any(f.unmapped for f in held.values())
        deadline = time.monotonic() + WAIT_S  # the tick hook, within about a second
        while deleted_index_maps(tmp_path / "store") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert deleted_index_maps(tmp_path / "store") == 0
        for name, f in held.items():
            assert f.unmapped == (name not in remaining), name
        # Its maps as they stand (not synced since): a walk over them declines, never raises.
        assert reader.query_offset("T", "k119", 64, 0, 2**62) is None
    finally:
        resume.set()
        thread.join(WAIT_S)
    assert not thread.is_alive() and len(answers) == 6
    expected = [query_via_actor(store, monkeypatch, "T", f"k{i}") for i in (0, 59, 60, 119)]
    assert answers[1:5] == expected and answers[5] == query_via_actor(store, monkeypatch, "T", "all", 64)
    assert not answers[1].messages and answers[4].messages
    assert reader.mapped_names == index_names(tmp_path / "store")


def cleaner_helpers() -> Any:
    """tests/cleaner's harness module (a store on the simulated disk whose files age with a
    manual clock), loaded by path once under the name its own conftest uses."""
    name = "mqstore_cleaner_test_helpers"
    if name not in sys.modules:
        path = Path(__file__).parent.parent / "cleaner" / "cleaner_helpers.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def test_after_the_cleaner_deletes_index_files_queries_answer_as_the_actor_with_no_stale_maps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    H = cleaner_helpers()
    monkeypatch.setattr(cleaner_module, "CLEAN_FIRST_DELAY_MS", 0)  # (a minute of the monotonic clock)
    clock = H.ManualClock()
    fs = SimulatedFileSystem(clock_ms=clock)
    fs.makedirs("/store")
    gauge = FixedDiskGauge(0.10)
    store = mqstore.open(
        "/store", fs=fs, clock_ms=clock, disk_gauge=gauge, cleaner_sleep_ms=lambda _ms: None,
        **{**H.SMALL, "clean_file_forcibly_enable": True},
    )
    try:
        h = H.Harness(store, fs, clock, gauge, [])
        clock.set(H.local_ms(0, 10))
        h.fill_segments(8)
        end = store.max_offset(H.TOPIC, 0)
        keys = [r.keys for off in range(0, end, 32) for r in store.get(H.TOPIC, 0, off, 32).messages]
        assert store.query(H.TOPIC, keys[0]).messages
        reader = thread_index_reader(store)
        before = reader.mapped_names
        assert before == tuple(sorted(h.index_files())) and len(before) >= 2
        clock.set(H.local_ms(0, 10) + 60_000)
        gauge.set(0.86)  # above the forced-clean ratio: expired or not, the oldest files go
        r = h.tick()
        assert r.commitlog_deleted >= 1 and r.index_deleted >= 1
        remaining = tuple(sorted(h.index_files()))
        found_any = 0
        for key in keys[:: max(1, len(keys) // 40)] + keys[-3:]:
            direct = store.query(H.TOPIC, key)
            assert direct == query_via_actor(store, monkeypatch, H.TOPIC, key), key
            found_any += bool(direct.messages)
        assert found_any and not store.query(H.TOPIC, keys[0]).messages  # its segment is gone
        assert reader.mapped_names == remaining and len(remaining) < len(before)
    finally:
        store.close()
    assert reader.closed and not reader.mapped_names


def test_queries_answer_after_the_index_actor_crashes_mid_write_and_restarts(
    tmp_path: Path, open_store: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = FaultPlan()
    store = open_store(faults=plan, **SMALL_INDEX)
    results = {f"k{i}": put_ok(store, [f"k{i}"]) for i in range(40)}
    assert store.query("T", "k0").messages
    first_view = store.read_view.view
    for crash in range(1, 3):
        plan.arm("index.mid_write", 1)
        # Puts until the index hits the fault, and a few more while the supervisor restarts it
        # (and reput); bounded by time, not by puts: on a loaded machine the index runs
        # thousands of puts behind, and a restart outlasts thousands more.
        i = first = len(results)
        deadline = time.monotonic() + 30
        while len(store.supervisor.restarts) < crash:
            if i - first < 300:
                results[f"k{i}"] = put_ok(store, [f"k{i}"])
                i += 1
            else:
                time.sleep(0.01)
            assert time.monotonic() < deadline, f"no restart after the fault: it fired {plan.fired['index.mid_write']} times"
        for _ in range(20):  # after the restart, with dispatch replaying
            results[f"k{i}"] = put_ok(store, [f"k{i}"])
            i += 1
        for key, result in results.items():
            found = store.query("T", key)
            assert [m.commitlog_offset for m in found.messages] == [result.commitlog_offset], key
    assert plan.fired["index.mid_write"] == 2
    assert store.read_view.view.index_files != first_view.index_files  # the restarted actor published
    assert store.query("T", "k3") == query_via_actor(store, monkeypatch, "T", "k3")
    assert thread_index_reader(store).mapped_names == index_names(tmp_path / "store")


def test_without_a_mappable_file_queries_ask_the_actor(open_store: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/store")
    store = open_store(Path("/store"), fs=fs, **SMALL_INDEX)
    counter = AskCounter(store, monkeypatch)
    assert store.query("T", "a").messages == ()
    assert counter.index_asks == 0  # the actor published its (empty) index at start
    result = put_ok(store, ["a"])
    wait_indexed(store, result.commitlog_offset + result.wrote_bytes)  # the owner mapped its file
    fs.inject_fault("map", path_contains="/index/", count=1)
    assert [m.commitlog_offset for m in store.query("T", "a").messages] == [result.commitlog_offset]
    assert counter.index_asks == 1  # the map failed: the actor answered
    assert [m.commitlog_offset for m in store.query("T", "a").messages] == [result.commitlog_offset]
    assert counter.index_asks == 1  # mapped now: read directly


def test_a_reader_closed_under_a_walk_answers_none_and_close_unmaps_every_reader(open_store: Open) -> None:
    store = open_store(**SMALL_INDEX)
    for i in range(60):
        put_ok(store, [f"k{i}"])
    assert store.query("T", "k1").messages  # this thread's puts are indexed: so files exist
    mine = thread_index_reader(store)
    readers: list[IndexReader] = []

    def query_in_thread() -> None:
        assert store.query("T", "k1").messages
        readers.append(thread_index_reader(store))

    assert not run_threads([query_in_thread, query_in_thread])
    assert all(r.mapped_names for r in readers + [mine])
    # close() from another thread while this one is inside the walk.
    files = list(mine._files)
    real_reload = files[-1].reload_header

    def close_then_reload() -> None:
        mine.close()
        real_reload()

    files[-1].reload_header = close_then_reload  # type: ignore[method-assign]
    assert mine.query_offset("T", "k1", 32, 0, 2**63 - 1) is None
    store.close()
    assert all(r.closed and not r.mapped_names for r in readers)
    assert all(f._region.buf.closed for f in files)
    with pytest.raises(mqstore.StoreClosedError):
        store.query("T", "k1")


# -- descriptors: one map per index file, whatever the number of querying threads --------------


def index_fds_and_maps(root: Path) -> tuple[int, int]:
    """This process's descriptors open on root/index's files, and its maps of them."""
    index_dir = str(root / "index")
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds += os.readlink(f"/proc/self/fd/{fd}").startswith(index_dir + "/")
        except OSError:
            pass  # (the listing's own descriptor, closed since)
    with open("/proc/self/maps") as maps:
        mapped = sum(1 for line in maps if index_dir + "/" in line)
    return fds, mapped


def test_querying_threads_share_one_read_map_per_index_file(tmp_path: Path, open_store: Open) -> None:
    """Review 84 F3: every thread that queried by key mapped every index file for itself, and
    CPython's mmap keeps a descriptor per map: 51 index files and 32 idle querying threads (an
    aio pool) held 1,632 descriptors, and under `ulimit -n 1024` the host's own open() failed
    and queries answered no hits. The readers share one read-only map per file: the owner's
    map and that one, however many threads query, and they stay shared as files roll."""
    store = open_store(**SMALL_INDEX)
    results = [put_ok(store, [f"k{i}", "all"]) for i in range(200)]
    wait_indexed(store, results[-1].commitlog_offset + results[-1].wrote_bytes)
    files = len(index_names(tmp_path / "store"))
    assert files >= 8
    threads_n = 12
    queried, resume = threading.Barrier(threads_n + 1), threading.Event()
    answers: list[tuple[int, ...]] = []

    def idle_host_thread(i: int) -> None:
        key = f"k{(i * 17) % 200}"
        answers.append(tuple(m.commitlog_offset for m in store.query("T", key).messages))
        queried.wait(WAIT_S)
        resume.wait(WAIT_S)

    threads = [threading.Thread(target=idle_host_thread, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    try:
        queried.wait(WAIT_S)
        assert sorted(answers) == sorted((results[(i * 17) % 200].commitlog_offset,) for i in range(threads_n))
        fds, mapped = index_fds_and_maps(tmp_path / "store")
        # The owner maps its files for writing (and may hold one made ahead); the readers one each.
        assert fds <= 2 * files + 2 and mapped <= 2 * files + 2, (fds, mapped, files)
        more = [put_ok(store, [f"n{i}"]) for i in range(100)]  # files roll meanwhile
        wait_indexed(store, more[-1].commitlog_offset + more[-1].wrote_bytes)
        assert [m.commitlog_offset for m in store.query("T", "n99").messages] == [more[-1].commitlog_offset]
        files = len(index_names(tmp_path / "store"))
        fds, mapped = index_fds_and_maps(tmp_path / "store")
        assert fds <= 2 * files + 2 and mapped <= 2 * files + 2, (fds, mapped, files)
    finally:
        resume.set()
        for thread in threads:
            thread.join(WAIT_S)
    store.close()
    assert index_fds_and_maps(tmp_path / "store") == (0, 0)
