"""An open of a store with thousands of queues (review 71 F3): each queue's recovery read its
whole ConsumeQueue file (6 MB by default, mostly its unwritten tail), inside the ConsumeQueue
actor's start, which the supervisor waited for 30 s and no longer: a store of 5,000 topics
took every put and could never be opened again (a bare "Timeout: 30.0 seconds").

Now recovery reads a queue file in growing chunks up to its first invalid unit, and the
supervisor waits for a start as long as it moves (the ConsumeQueue actor reports each queue);
a start that stops moving fails naming the actor."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import Message, supervisor
from mqstore.storage.consume_queue import ConsumeQueue
from mqstore.storage.mapped_file import MappedFile

UNITS_A_FILE = 10_000
SETTINGS = dict(
    mapped_file_size_commitlog_bytes=4 * 1024 * 1024,
    mapped_file_size_consume_queue_bytes=20 * UNITS_A_FILE,
    max_hash_slot_num=64,
    max_index_num=400,
    message_index_enable=False,
)


def test_recovery_reads_a_queue_file_up_to_its_end_in_chunks_and_finds_every_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "s"
    long_queue = UNITS_A_FILE + 2_500  # one file full, the next past the first chunks (4,096 units)
    with mqstore.open(store, **SETTINGS) as s:
        for start in range(0, long_queue, 500):
            assert s.put_batch([Message("long", b"%d" % i) for i in range(start, min(start + 500, long_queue))]).ok
        for topic in range(200):
            assert s.put(Message(f"q{topic}", b"one")).ok
    read: list[int] = []
    read_data = MappedFile.read_data

    def counting(self: MappedFile, start: int, end: int) -> bytes:
        data = read_data(self, start, end)
        read.append(len(data))
        return data

    monkeypatch.setattr(MappedFile, "read_data", counting)
    with mqstore.open(store, **SETTINGS) as s:
        assert s.max_offset("long", 0) == long_queue
        assert [m.body for m in s.get("long", 0, long_queue - 2, 8).messages] == [b"%d" % (long_queue - 2), b"%d" % (long_queue - 1)]
        assert s.put(Message("long", b"next")).queue_offset == long_queue
        assert all(s.max_offset(f"q{topic}", 0) == 1 for topic in range(200))
    # A queue of one unit is read one first chunk (80 KiB), not its whole file; 2 reads each
    # (the owner's recovery, then the queue it opens).
    assert sum(read) < (200 + 20) * 2 * 80 * 1024, sum(read)


def _slow_recovery(monkeypatch: pytest.MonkeyPatch, seconds: float, only: str | None = None) -> None:
    recover = ConsumeQueue.recover

    def slow(self: ConsumeQueue, *args: Any) -> None:
        if only is None or self.topic == only:
            time.sleep(seconds)
        recover(self, *args)

    monkeypatch.setattr(ConsumeQueue, "recover", slow)


def test_an_open_waits_for_queue_recovery_as_long_as_it_moves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "s"
    with mqstore.open(store, **SETTINGS) as s:
        for topic in range(40):
            assert s.put(Message(f"q{topic}", b"%d" % topic)).ok
    monkeypatch.setattr(supervisor, "START_TIMEOUT_S", 0.3)
    _slow_recovery(monkeypatch, 0.02)  # 40 queues, twice: ~1.6 s of recovery, 0.3 s a wait
    with mqstore.open(store, **SETTINGS) as s:
        assert all([m.body for m in s.get(f"q{topic}", 0, 0, 4).messages] == [b"%d" % topic] for topic in range(40))


def test_a_queue_recovery_that_stops_moving_fails_the_open_naming_the_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "s"
    with mqstore.open(store, **SETTINGS) as s:
        assert s.put(Message("stuck", b"x")).ok
    monkeypatch.setattr(supervisor, "START_TIMEOUT_S", 0.3)
    monkeypatch.setattr(supervisor, "PAUSE_GRACE_S", 0.1)  # (the grace after a timeout, for a paused process)
    _slow_recovery(monkeypatch, 1.5, only="stuck")
    with pytest.raises(TimeoutError, match="consume_queue actor did not start: its recovery made no progress"):
        mqstore.open(store, **SETTINGS)
    time.sleep(1.6)  # the stuck recovery's thread ends before tmp_path goes
    monkeypatch.undo()
    with mqstore.open(store, **SETTINGS) as s:
        assert [m.body for m in s.get("stuck", 0, 0, 4).messages] == [b"x"]
