"""The TransientStorePool path (§4.6, §7.4): appends go to write buffers, the commit service's
ticks copy them into the files, and readers only ever see committed bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mqstore
from mqstore import GetMessageStatus, Message
from mqstore.messages import GetWriterStatus
from mqstore.tools.verify import verify_store

SEGMENT = 1 << 20


def test_committed_bytes_only_are_readable_and_every_message_survives_segment_rolls(tmp_path: Path) -> None:
    settings = dict(
        transient_store_pool_enable=True,
        transient_store_pool_size=2,  # fewer buffers than segments: later files take the mmap path
        mapped_file_size_commitlog_bytes=SEGMENT,
        commit_interval_commitlog_ms=200,
    )
    with mqstore.open(tmp_path, **settings) as store:
        writer = store.supervisor.ctx.peers["writer"]
        first = store.put(Message(topic="T", body=b"x" * 100))
        assert first.ok
        ready = writer.ask(GetWriterStatus())
        assert ready.wrote_offset == first.wrote_bytes
        assert ready.max_offset <= ready.wrote_offset  # readable = committed, not yet the put
        assert store.wait_for_messages("T", 0, 0, 5)
        # 60 x 50 KB: three 1 MiB segments, rolled while earlier tails still wait for commit.
        results = [store.put(Message(topic="T", body=bytes([i]) * 50_000, keys=[f"k{i}"])) for i in range(60)]
        assert all(r.ok for r in results)
        assert store.wait_for_messages("T", 0, 60, 10)
        offset, bodies = 0, []
        while offset < 61:
            got = store.get("T", 0, offset, 32)
            assert got.status is GetMessageStatus.FOUND, (offset, got.status)
            bodies.extend(m.body for m in got.messages)
            offset = got.next_begin_offset
        assert bodies == [b"x" * 100] + [bytes([i]) * 50_000 for i in range(60)]
        assert [m.body[:1] for m in store.query("T", "k42").messages] == [bytes([42])]
    report = verify_store(tmp_path)
    assert report.ok, report


def test_a_pool_larger_than_the_memory_available_is_refused_at_open(tmp_path: Path, monkeypatch: Any) -> None:
    """Review 35 F4: the pool is allocated whole at start (RocketMQ's default: 5 x 1 GiB); more
    than the machine has was a MemoryError, or the OOM killer's, not a refusal."""
    import pytest

    from mqstore.actors import commitlog_writer

    from mqstore.storage.memory import MemoryRoom

    monkeypatch.setattr(commitlog_writer, "memory_room", lambda: MemoryRoom(total=64 * SEGMENT, available=3 * SEGMENT))
    settings = dict(transient_store_pool_enable=True, transient_store_pool_size=4, mapped_file_size_commitlog_bytes=SEGMENT)
    with pytest.raises(mqstore.ConfigError, match="transient_store_pool_size=4: 4 write buffers .* 3145728 are available"):
        mqstore.open(tmp_path / "s", **settings)
    with mqstore.open(tmp_path / "s", **{**settings, "transient_store_pool_size": 3}) as store:  # it fits: opens
        assert store.put(Message(topic="T", body=b"x")).ok
