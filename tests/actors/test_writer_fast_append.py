"""The writer's fast append (CommitLog.append_fast) against the checked path, through a whole
store: the same puts give the same commitlog bytes and the same PutResults, and the puts that
must be checked (roll-over, transactions, sizes, an armed fault plan) are."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from mqstore import Message, MessageStore, PutResult
from mqstore.actors import commitlog_writer
from mqstore.faults import FaultPlan
from mqstore.read_view import ReadView, ReadViewPublisher
from mqstore.storage import speedups
from mqstore.storage.status import PutMessageStatus

helpers = sys.modules["mqstore_actor_test_helpers"]

pytestmark = pytest.mark.skipif(speedups.native is None, reason="the fast append needs the C extension (_native)")

TIMEOUT_S = 15.0
NOW_MS = 1_700_000_000_000


def _writer(store: MessageStore) -> Any:
    return store.supervisor.ctx.peers["writer"].proxy()._actor  # reaching in to read its counters


def _commitlog(store: MessageStore) -> Any:
    return _writer(store)._commitlog


def _segments(store_dir: Path) -> dict[str, bytes]:
    root = store_dir / "commitlog"
    return {name: (root / name).read_bytes() for name in sorted(os.listdir(root))}


def _workload(store: MessageStore) -> list[PutResult]:
    """Singles and batches over three queues, big and small, enough to roll 64 KiB segments
    several times; then bursts of futures of one queue (appended as runs, in their order)."""
    results: list[PutResult] = []
    for i in range(300):
        queue_id = i % 3
        body = bytes([65 + i % 26]) * (50 + (i * 37) % 1500)
        if i % 7 == 0:
            batch = [Message(topic="T", body=body[: 40 + k], queue_id=queue_id, keys=[f"k{i}-{k}"]) for k in range(5)]
            results.append(store.put_batch(batch))
        else:
            results.append(store.put(Message(topic="T", body=body, queue_id=queue_id, tags="t", keys=[f"k{i}"])))
    for _ in range(5):
        futures = [store.put_async(Message(topic="U", body=b"u" * (10 + 90 * k), queue_id=1)) for k in range(64)]
        results.extend(f.result(TIMEOUT_S) for f in futures)
    return results


@pytest.mark.parametrize("flush_disk_type", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_fast_and_checked_writers_store_the_same_bytes_and_answer_the_same(tmp_path: Path, flush_disk_type: str) -> None:
    runs: dict[bool, tuple[list[PutResult], dict[str, bytes]]] = {}
    for fast in (True, False):
        store_dir = tmp_path / ("fast" if fast else "checked")
        # Any plan but NO_FAULTS keeps the writer on the checked path (nothing is armed here).
        faults = {} if fast else {"faults": FaultPlan()}
        store = helpers.open_small(store_dir, clock_ms=lambda: NOW_MS, flush_disk_type=flush_disk_type, **faults)
        try:
            results = _workload(store)
            fast_appends = _commitlog(store).fast_appends
            # What back-pressure (put_msg_index_high_water) counts as appended, fed by both paths.
            appended_records = _writer(store)._lag._appended
        finally:
            store.close()
        assert appended_records == sum(r.msg_num for r in results)
        assert all(r.status is PutMessageStatus.PUT_OK for r in results), [r for r in results if not r.ok][:3]
        if fast:
            assert fast_appends > 200, "the fast path was hardly taken"  # appends: a run of futures is one
        else:
            assert fast_appends == 0
        runs[fast] = (results, _segments(store_dir))
    assert len(runs[True][1]) > 3  # several segments: roll-overs went through the checked path
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] == runs[False][1]


def test_puts_the_checked_path_must_decide_are_decided_there(store_dir: Path) -> None:
    with helpers.open_small(store_dir, max_message_size_bytes=4096) as store:
        assert store.put(Message(topic="T", body=b"first")).ok  # checks the file
        commitlog = _commitlog(store)
        taken = commitlog.fast_appends
        assert store.put(Message(topic="T", body=b"second")).ok
        assert commitlog.fast_appends == taken + 1
        # Too large: refused by the checked path's size check, nothing written.
        end = commitlog.get_max_offset()
        assert store.put(Message(topic="T", body=b"x" * 8000)).status is PutMessageStatus.MESSAGE_ILLEGAL
        assert commitlog.get_max_offset() == end and commitlog.fast_appends == taken + 1
        # A roll-over: the put that does not fit the segment's end goes through the checked path.
        segment = 64 * 1024
        while commitlog.get_max_offset() // segment == 0:
            assert store.put(Message(topic="T", body=b"y" * 1000)).ok
        rolled = commitlog.fast_appends
        assert store.put(Message(topic="T", body=b"after the roll-over")).ok
        assert commitlog.fast_appends == rolled + 1


def test_the_writers_publication_keeps_every_other_fact_of_the_read_view() -> None:
    """publish_commitlog builds the view positionally (once per pass): a field added to
    ReadView and left out there would be reset by every put; each field here is a sentinel."""
    publisher = ReadViewPublisher()
    sentinels = {f.name: object() for f in dataclasses.fields(ReadView) if f.name != "readable_end"}
    publisher.view = ReadView(readable_end=10, **sentinels)  # type: ignore[arg-type]
    publisher.publish_commitlog(20)
    view = publisher.view
    assert view.readable_end == 20
    assert all(getattr(view, name) is value for name, value in sentinels.items())
    publisher.publish_commitlog(15)  # never back
    assert publisher.view is view


def test_the_writer_builds_put_results_with_every_field_in_order() -> None:
    """The writer builds a stored put's PutResult as a plain tuple (no NamedTuple __new__ per
    put): that is only right while PutResult has exactly these fields in this order."""
    assert PutResult._fields == commitlog_writer.PUT_RESULT_FIELDS


def test_a_pass_of_several_queues_appends_each_queue_fast_and_answers_each_put_rightly(store_dir: Path) -> None:
    """Futures to four queues at once (the demo's shape): each pass appends one run per queue,
    each on the fast path, and every answer names where its own record lies."""
    with helpers.open_small(store_dir) as store:
        assert store.put(Message(topic="Q", body=b"checks the file")).ok
        commitlog = _commitlog(store)
        writer = _writer(store)
        fast_before, passes_before = commitlog.fast_appends, writer.passes
        messages = [Message(topic="Q", body=b"q%d-%d" % (i % 4, i), queue_id=i % 4) for i in range(400)]
        futures = [store.put_async(m) for m in messages]
        results = [f.result(TIMEOUT_S) for f in futures]
        assert all(r.ok for r in results)
        runs = commitlog.fast_appends - fast_before
        passes = writer.passes - passes_before
        assert runs >= passes and passes < len(messages)  # runs of futures, not one append per put
        expected_next = {q: (1 if q == 0 else 0) for q in range(4)}
        for message, result in zip(messages, results):
            record = store.lookup(result.commitlog_offset, result.wrote_bytes)
            assert record is not None and record.body == message.body
            assert record.queue_offset == result.queue_offset == expected_next[message.queue_id]
            expected_next[message.queue_id] += 1

