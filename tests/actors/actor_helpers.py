"""Helpers of the actor-level tests (loaded by conftest.py, tests/ has no packages): a small store, producers that keep a ledger of
every put and its answer, and the invariants a store must keep across any crash.

The invariants (checked by `check_invariants`) are the contract of issue 3:
  * every stored put (PUT_OK, or FLUSH_DISK_TIMEOUT whose bytes are in the log) is readable
    exactly once by walking its queue from offset 0 and exactly once by its unique key;
  * a refused put (SERVICE_NOT_AVAILABLE during a restart) may or may not be stored, but a
    batch is all there or all absent, never half;
  * every ConsumeQueue unit points at a whole record below the commitlog's end, at the queue
    offset it claims, and `lookup` finds the same record there;
  * queue offsets handed out never go backwards: per queue, stored results ordered by
    commitlog offset have strictly increasing queue offsets, and each sits where it said.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mqstore
from mqstore import Message, MessageStore, PutResult
from mqstore.messages import GetReputStatus, GetWriterStatus
from mqstore.storage.status import GetMessageStatus

# Tiny files so a few hundred puts roll commitlog segments (and so reach the allocator).
SMALL: dict[str, Any] = {
    "mapped_file_size_commitlog_bytes": 64 * 1024,
    "mapped_file_size_consume_queue_bytes": 20 * 1000,
    "max_hash_slot_num": 5000,
    "max_index_num": 20000,
    # A put that waits over this in the writer's inbox is refused OS_PAGE_CACHE_BUSY, unstored, as
    # RocketMQ refuses it. The default (1 s) is a wait a loaded CI machine reaches (stop 55's CI run:
    # one of 500 put_async refused); tests that check the refusal name their own value.
    "os_page_cache_busy_timeout_ms": 60_000,
}

TOPIC = "faults"
WAIT_TIMEOUT_S = 15.0
POLL_S = 0.005


def open_small(path: Path | str, **settings: Any) -> MessageStore:
    return mqstore.open(path, **{**SMALL, **settings})


def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_TIMEOUT_S, what: str = "condition") -> None:
    """For things only observable by looking (an asynchronous restart): short polls, hard limit."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(POLL_S)


def wait_dispatched(store: MessageStore, timeout_s: float = 5.0) -> int:
    """Wait until dispatch has read everything the writer wrote; returns the commitlog end.
    Reads after this see it: the ConsumeQueue mailbox is FIFO, and query waits until the
    index covers the dispatched end."""
    peers = store.supervisor.ctx.peers

    def caught_up() -> bool:
        writer, reput = peers.get("writer"), peers.get("reput")
        if writer is None or reput is None:
            return False
        try:
            end = writer.ask(GetWriterStatus(), timeout=5).max_offset
            return bool(reput.ask(GetReputStatus(), timeout=5).reput_offset >= end)
        except Exception:  # one of them is being restarted
            return False

    wait_until(caught_up, timeout_s, "dispatch to catch up with the writer")
    return int(peers["writer"].ask(GetWriterStatus(), timeout=5).max_offset)


# ---------------------------------------------------------------------------------------
# Producers with a ledger


@dataclass
class Entry:
    keys: tuple[str, ...]
    queue_id: int
    batch: bool
    result: PutResult
    seconds: float


@dataclass
class Ledger:
    entries: list[Entry] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, entry: Entry) -> None:
        with self.lock:
            self.entries.append(entry)

    def snapshot(self) -> list[Entry]:
        with self.lock:
            return list(self.entries)

    def ok_count(self) -> int:
        with self.lock:
            return sum(1 for e in self.entries if e.result.ok)


def body_for(key: str) -> bytes:
    return (key + ":").encode() + b"x" * 400  # ~500-byte records: a 64 KiB segment holds ~120


class Producers:
    """`threads` producers putting to TOPIC (queues 0 and 1, so two share each queue),
    alternating single puts and batches of 2-4, one unique key per message. They can be
    paused at a put boundary, so checks see a quiet store."""

    def __init__(self, store: MessageStore, threads: int = 3) -> None:
        self.store = store
        self.ledger = Ledger()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._paused = False
        self._idle = 0
        self._threads = [threading.Thread(target=self._run, args=(t,), daemon=True) for t in range(threads)]
        self.errors: list[BaseException] = []

    def __enter__(self) -> Producers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self.resume()
        for thread in self._threads:
            thread.join(timeout=30)
            assert not thread.is_alive(), "a producer hung in put"

    def pause(self) -> None:
        """Return once every producer waits at a put boundary (no put in flight)."""
        with self._cond:
            self._paused = True
            ok = self._cond.wait_for(lambda: self._idle == len(self._threads) or self._stop.is_set(), timeout=30)
        assert ok, "producers did not reach a put boundary (a put hung)"

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def _checkpoint(self) -> None:
        with self._cond:
            if not self._paused:
                return
            self._idle += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._paused or self._stop.is_set())
            self._idle -= 1

    def _run(self, t: int) -> None:
        n = 0
        queue_id = t % 2
        try:
            while not self._stop.is_set():
                self._checkpoint()
                size = 1 if n % 2 == 0 else 2 + n % 3
                keys = tuple(f"p{t}-{n + i}" for i in range(size))
                n += size
                messages = [Message(topic=TOPIC, queue_id=queue_id, body=body_for(k), keys=[k]) for k in keys]
                started = time.monotonic()
                result = self.store.put(messages[0]) if size == 1 else self.store.put_batch(messages)
                self.ledger.add(Entry(keys, queue_id, size > 1, result, time.monotonic() - started))
                if not result.ok:
                    time.sleep(0.001)  # the store is restarting something: do not spin
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)


# ---------------------------------------------------------------------------------------
# Invariants


def walk_queue(store: MessageStore, topic: str, queue_id: int, commitlog_end: int) -> dict[int, Any]:
    """Every record of a queue from offset 0, by queue offset, checking each unit on the way."""
    found: dict[int, Any] = {}
    max_offset = store.max_offset(topic, queue_id)
    offset = 0
    while offset < max_offset:
        got = store.get(topic, queue_id, offset, 32)
        assert got.status is GetMessageStatus.FOUND, f"{topic}/{queue_id} at {offset}: {got.status}"
        for i, record in enumerate(got.messages):
            at = offset + i
            assert record.queue_offset == at, f"unit {at} points at a record with queue offset {record.queue_offset}"
            assert record.commitlog_offset + record.total_size <= commitlog_end, (
                f"unit {at} points past the commitlog end {commitlog_end}"
            )
            looked = store.lookup(record.commitlog_offset)
            assert looked is not None and looked.keys == record.keys
            found[at] = record
        assert got.next_begin_offset == offset + len(got.messages), "a hole in the queue"
        offset = got.next_begin_offset
    assert len(found) == max_offset
    return found


def check_invariants(store: MessageStore, entries: list[Entry]) -> dict[str, int]:
    """Check the module docstring's invariants for every entry; returns counts for reports."""
    end = wait_dispatched(store)
    seen: Counter[str] = Counter()
    at_offset: dict[tuple[int, int], str] = {}
    for queue_id in (0, 1):
        for qo, record in walk_queue(store, TOPIC, queue_id, end).items():
            seen[record.keys] += 1
            at_offset[(queue_id, qo)] = record.keys
    duplicated = [k for k, n in seen.items() if n != 1]
    assert not duplicated, f"stored more than once: {duplicated[:5]}"

    stored = refused_in = refused_out = repeated = 0
    for entry in entries:
        present = [seen[k] for k in entry.keys]
        if entry.result.stored:
            stored += 1
            assert present == [1] * len(entry.keys), f"acknowledged {entry.keys} ({entry.result.status}) is missing"
            for i, key in enumerate(entry.keys):
                assert at_offset[(entry.queue_id, entry.result.queue_offset + i)] == key, (
                    f"{key} is not at the queue offset its put returned"
                )
        else:
            assert present in ([0] * len(entry.keys), [1] * len(entry.keys)), (
                f"half a batch stored: {entry.keys} -> {present} ({entry.result.status})"
            )
            if present[0]:
                refused_in += 1
            else:
                refused_out += 1
        for key in entry.keys:
            hits = store.query(TOPIC, key).messages
            distinct = {m.commitlog_offset for m in hits}
            # The same record twice (a re-indexed message after an index/consume_queue restart)
            # is counted in "query_repeats" and reported; a second *record* would be a duplicate put.
            assert len(distinct) == seen[key], f"query({key}) found {len(distinct)}, the queue holds {seen[key]}"
            repeated += len(hits) - len(distinct)
            if hits:
                assert hits[0].body == body_for(key)

    for queue_id in (0, 1):
        ok = sorted(
            (e.result.commitlog_offset, e.result.queue_offset)
            for e in entries
            if e.result.stored and e.queue_id == queue_id
        )
        offsets = [qo for _phy, qo in ok]
        assert offsets == sorted(set(offsets)), f"queue {queue_id}: queue offsets went backwards or repeated"
    return {
        "stored": stored, "refused_but_stored": refused_in, "refused_absent": refused_out, "query_repeats": repeated
    }


def in_a_forked_child(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`work()` in a forked child; its answer, and how long the child took to exit."""
    read, write = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: answer, then exit through the exit handlers, as a host does
        os.close(read)
        try:
            answer = work()
        except BaseException as exc:  # reported, not raised into the test runner's copy
            answer = {"error": repr(exc)}
        os.write(write, json.dumps(answer).encode())
        os.close(write)
        try:
            sys.exit(0)
        finally:
            os._exit(0)  # (pytest's own machinery must not go on in the child)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    answer: dict[str, Any] = json.loads(b"".join(chunks))
    answer["exit_s"] = time.monotonic() - started
    return answer
