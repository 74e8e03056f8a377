"""A real store on real files, filled past a disk budget, shrinks while a producer and a
consumer keep running, and loses nothing that is not expired."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import GetMessageStatus, Message
from mqstore.actors import cleaner as cleaner_module

H = sys.modules["mqstore_cleaner_test_helpers"]
BUDGET_RUN_S = 20.0


def store_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                pass  # deleted while we walked
    return total


class BudgetGauge:
    """The used ratio of a disk of `budget` bytes holding only this store's files; until a
    budget is set, a quiet 10 %."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.budget: int | None = None

    def used_ratio(self, path: str) -> float:
        if self.budget is None:
            return 0.10
        return store_bytes(self.root) / self.budget


def test_a_store_over_its_budget_shrinks_under_load_and_keeps_every_unexpired_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cleaner_module, "CLEAN_FIRST_DELAY_MS", 0)
    root = tmp_path / "store"
    seg = H.SEGMENT_BYTES
    settings = {**H.SMALL, "clean_resource_interval_ms": 20, "delete_commitlog_files_interval_ms": 5,
                "delete_consume_queue_files_interval_ms": 1, "file_reserved_time_hours": 1,
                "delete_when": f"{(time.localtime().tm_hour + 12) % 24:02d}"}  # not now: space rules only  # fmt: skip
    gauge = BudgetGauge(root)  # quiet while the old data is written
    store = mqstore.open(root, disk_gauge=gauge, **settings)
    try:
        ctx = store.supervisor.ctx
        body = b"y" * 900
        # Phase 1: 24 segments of "old" data, then aged 4 days by their file times.
        while True:
            ready = ctx.peers["writer"].ask(mqstore.messages.GetWriterStatus())
            if ready.max_offset >= 24 * seg:
                break
            assert store.put(Message(topic=H.TOPIC, queue_id=0, body=body)).ok
        store.flush()
        ready = ctx.peers["writer"].ask(mqstore.messages.GetWriterStatus())
        full_end = ready.max_offset - ready.max_offset % seg  # segments below are complete
        old_time = time.time() - 4 * 24 * 3600
        for name in os.listdir(root / "commitlog"):
            if name.isdigit() and int(name) + seg <= full_end:
                os.utime(root / "commitlog" / name, (old_time, old_time))
        used_then = store_bytes(root)
        budget = int(used_then / 0.80)  # 80 %: above the 75 % ratio, below the forced 85 %

        # Phase 2: a producer and a consumer run while the cleaner works against the budget.
        acked: list[tuple[int, int]] = []  # (queue offset, commitlog offset) of each new put
        errors: list[BaseException] = []
        refused = []
        stop = threading.Event()

        def produce() -> None:
            try:
                while not stop.is_set():
                    r = store.put(Message(topic=H.TOPIC, queue_id=0, body=body))
                    if r.ok:
                        acked.append((r.queue_offset, r.commitlog_offset))
                    else:
                        refused.append(r.status)
                    time.sleep(0.001)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        seen_statuses: set[GetMessageStatus] = set()

        def consume() -> None:
            offset = 0
            try:
                while not stop.is_set():
                    r = store.get(H.TOPIC, 0, offset, 32)
                    seen_statuses.add(r.status)
                    if r.status is GetMessageStatus.FOUND:
                        offset = r.next_begin_offset
                    elif r.status in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.MESSAGE_WAS_REMOVING,
                                      GetMessageStatus.OFFSET_FOUND_NULL):  # fmt: skip
                        offset = r.next_begin_offset
                    else:
                        time.sleep(0.002)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
        for t in threads:
            t.start()
        gauge.budget = budget
        deadline = time.monotonic() + BUDGET_RUN_S
        shrunk = False
        while time.monotonic() < deadline:
            first = ctx.peers["writer"].ask(mqstore.messages.GetWriterStatus()).min_offset
            if first >= full_end and gauge.used_ratio("") < 0.75:
                shrunk = True
                break
            time.sleep(0.05)
        time.sleep(0.3)  # a few more rounds under load
        stop.set()
        for t in threads:
            t.join(10)
        assert not errors, errors
        assert shrunk, f"still at {gauge.used_ratio(''):.2f} of the budget"
        assert not refused, refused[:3]
        assert len(acked) > 50
        # Every old segment went, and nothing unexpired did.
        ready = ctx.peers["writer"].ask(mqstore.messages.GetWriterStatus())
        assert ready.min_offset == full_end
        assert store.min_offset(H.TOPIC, 0) > 0
        for queue_offset, phy in acked:
            got = store.get(H.TOPIC, 0, queue_offset, 1)
            assert got.status is GetMessageStatus.FOUND, (queue_offset, phy, got.status)
            assert got.messages[0].commitlog_offset == phy
        assert GetMessageStatus.FOUND in seen_statuses
        assert not (root / "commitlog" / "00000000000000000000").exists()
    finally:
        store.close()


# Small segments, every one but the newest expired at once (delete_expired_files_now).
_EXPIRING_SMALL_SEGMENTS: dict[str, Any] = dict(
    mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=2000,
    max_hash_slot_num=1000, max_index_num=4000, file_reserved_time_hours=0,
)  # fmt: skip


def _segment_inodes(commitlog: Path) -> set[int]:
    return {path.stat().st_ino for path in commitlog.iterdir()}


def _deleted_still_mapped(commitlog: Path, before: set[int]) -> int:
    """Maps of this process of the segments (inodes, taken `before` the deletion) deleted from
    `commitlog` since: their blocks not freed. By inode, not by the `(deleted)` a map's name
    ends with: a segment made ahead unnamed reads `commitlog/#<inode> (deleted)` for as long as
    it is mapped, named since or not (review 80 F4, 81 L3)."""
    deleted = before - _segment_inodes(commitlog)
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if f"{commitlog}/" in line and int(line.split()[4]) in deleted)


def test_segments_the_cleaner_deleted_are_unmapped_by_dispatch_within_seconds(tmp_path: Path) -> None:
    """Review 46 M5: reput's read-only maps kept deleted segments (and their blocks) until a
    reopen, so a full disk got nothing back from the cleaner. Its reader re-lists the segments
    every second now. (A host thread's own read maps re-list when it next reads.)"""
    import time

    import mqstore

    settings = _EXPIRING_SMALL_SEGMENTS
    commitlog = tmp_path / "s" / "commitlog"

    with mqstore.open(tmp_path / "s", **settings) as store:
        for i in range(1500):  # ~6 segments; no read from this thread (its maps are its own)
            assert store.put(mqstore.Message("T", b"x" * 200, keys=[f"k{i}"])).ok
        store.flush()
        deleted_still_mapped = functools.partial(_deleted_still_mapped, commitlog, _segment_inodes(commitlog))
        assert store.delete_expired_files_now() > 0
        deadline = time.monotonic() + 10
        while deleted_still_mapped() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert deleted_still_mapped() == 0


def test_segments_the_cleaner_deleted_are_unmapped_from_idle_host_threads_within_seconds(tmp_path: Path) -> None:
    """Review 46 M5, the rest: a host thread that read once and went idle kept its own maps of
    deleted segments for as long as it lived (it re-lists only when it reads again), so their
    blocks never went back to a full disk. A store tick hook now unmaps them from any thread;
    the idle thread's next read still answers (the deleted range as moved, the rest found)."""
    settings = _EXPIRING_SMALL_SEGMENTS
    commitlog = tmp_path / "s" / "commitlog"

    with mqstore.open(tmp_path / "s", **settings) as store:
        for i in range(1500):  # ~6 segments
            assert store.put(Message("T", b"x" * 200, queue_id=0, keys=[f"k{i}"])).ok
        store.flush()
        read_again = threading.Event()
        answers: list[object] = []

        def host_thread() -> None:  # reads every segment, then idles until told
            assert store.wait_for_messages("T", 0, 1499, 10)
            offset, seen = 0, 0
            while offset < 1500:  # (a get ends at a ConsumeQueue file's end: next_begin_offset)
                got = store.get("T", 0, offset, 32)
                seen, offset = seen + len(got.messages), got.next_begin_offset
            answers.append(seen)
            read_again.wait(30)
            answers.append(store.get("T", 0, 0, 32).status)
            answers.append(store.get("T", 0, 1499, 1).messages[0].queue_offset)

        thread = threading.Thread(target=host_thread)
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while not answers and time.monotonic() < deadline:
                time.sleep(0.01)
            assert answers == [1500]
            assert store.query("T", "k10", 1).messages  # this thread's maps too (a key lookup)
            deleted_still_mapped = functools.partial(_deleted_still_mapped, commitlog, _segment_inodes(commitlog))
            assert store.delete_expired_files_now() > 0
            deadline = time.monotonic() + 10
            while deleted_still_mapped() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert deleted_still_mapped() == 0
        finally:
            read_again.set()
            thread.join(10)
        assert answers[1] in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_FOUND_NULL) and answers[2] == 1499
