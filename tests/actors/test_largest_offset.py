"""A commitlog that reaches Java's Long.MAX_VALUE (review 52 L1): offsets are longs in RocketMQ's
files and in the C kernels, so no record may end past 2^63 - 1 and no segment may be named past
it. Before, the allocator made a segment named 2^63, the writer failed on an OverflowError, and
the store could not be opened or recovered again. Now the puts that do not fit are refused
with a detail saying why, and the store opens, reads and recovers as ever."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

import mqstore
from mqstore import supervisor
from mqstore.cli import main as cli_main
from mqstore.storage.codec import JAVA_LONG_MAX

SETTINGS = dict(mapped_file_size_consume_queue_bytes=20 * 200, max_hash_slot_num=64, max_index_num=400)


def _put_until_refused(store: mqstore.MessageStore, body: bytes, acked: list[tuple[int, bytes]]) -> mqstore.PutResult:
    for _ in range(1000):
        result = store.put(mqstore.Message("T", body))
        if not result.ok:
            return result
        acked.append((result.queue_offset, body))
    raise AssertionError("never refused")


@pytest.mark.parametrize("segment", [64 * 1024, 48 * 1024], ids=["the last segment ends at 2^63", "one spans 2^63"])
def test_puts_past_the_largest_offset_are_refused_and_the_store_opens_again(
    tmp_path: Path, segment: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A log whose only segment is empty and starts past 0, no queues: the first open waits for
    # re-dispatch to cover [0, its start) until it stops moving (two slices of this).
    monkeypatch.setattr(supervisor, "DISPATCH_CATCH_UP_TIMEOUT_MS", 200)
    path = tmp_path / "s"
    (path / "commitlog").mkdir(parents=True)
    first = (2**63 // segment - 2) * segment  # segments start at multiples of their size
    with open(path / "commitlog" / f"{first:020d}", "wb") as f:
        f.truncate(segment)
    acked: list[tuple[int, bytes]] = []
    settings = dict(SETTINGS, mapped_file_size_commitlog_bytes=segment)
    with mqstore.open(path, **settings) as store:
        refused = _put_until_refused(store, b"x" * 3000, acked)
        assert refused.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert f"past {JAVA_LONG_MAX} (Java's Long.MAX_VALUE)" in refused.detail
        # Nothing was written for it (not even a segment's blank end): smaller puts still fit.
        large = len(acked)
        refused = _put_until_refused(store, b"y" * 100, acked)
        assert len(acked) > large
        assert "Long.MAX_VALUE" in refused.detail and store.supervisor.state.name == "RUNNING"
        assert store.put(mqstore.Message("T", b"z" * 3000)).status is refused.status
    assert store.close() and len(acked) > 30
    names = sorted(os.listdir(path / "commitlog"))
    assert all(int(name) <= JAVA_LONG_MAX for name in names), names
    with mqstore.open(path, **settings) as store:
        got = [m for offset in range(0, len(acked), 32) for m in store.get("T", 0, offset, 32).messages]
        assert [(m.queue_offset, m.body) for m in got] == acked
        assert "Long.MAX_VALUE" in store.put(mqstore.Message("T", b"z" * 3000)).detail
    monkeypatch.setenv("MQSTORE_MAX_HASH_SLOT_NUM", "64")  # (index files this small say too little)
    monkeypatch.setenv("MQSTORE_MAX_INDEX_NUM", "400")
    for command in (["verify"], ["recover", "--no-progress"], ["verify"]):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert cli_main([*command, str(path)]) == 0, command
