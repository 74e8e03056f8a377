"""Each reading thread's commitlog reader maps at most READER_MAPPED_SEGMENTS segments at once
(review 76 H2). It mapped every segment, and each map holds a descriptor: with ~300 segments
three consumer threads used up a 1,024 descriptor limit, and then puts failed
CREATE_MAPPED_FILE_FAILED and the host's own open() EMFILE. Now the others are known by name
and size and mapped when read; what every thread reads is unchanged."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import mqstore
from mqstore import Message
from mqstore.storage import commitlog

SEGMENT = 64 * 1024
SETTINGS = dict(mapped_file_size_commitlog_bytes=SEGMENT, mapped_file_size_consume_queue_bytes=20 * 1000,
                max_hash_slot_num=1000, max_index_num=4000)  # fmt: skip
BODY = b"x" * 1000


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("budget", [16, 3])
def test_reading_threads_map_a_bounded_number_of_segments_and_read_everything(
    tmp_path: Path, budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commitlog, "READER_MAPPED_SEGMENTS", budget, raising=False)
    messages = 2_000  # ~2 MB: ~33 segments
    with mqstore.open(tmp_path / "s", **SETTINGS) as store:
        for start in range(0, messages, 50):
            assert store.put_batch([Message("t", BODY + b"%d" % i, keys=[f"k{i}"]) for i in range(start, start + 50)]).ok
        segments = len(os.listdir(tmp_path / "s" / "commitlog"))
        assert segments > 30
        assert store.max_offset("t", 0) == messages
        errors: list[BaseException] = []
        counts: list[int] = []
        go_on = threading.Event()
        done = threading.Barrier(5)

        def consume(first: int) -> None:
            try:
                offset, seen = first, 0
                while offset < messages:
                    got = store.get("t", 0, offset, 32)
                    assert got.found, (offset, got.status)
                    for m in got.messages:
                        assert m.queue_offset == offset and m.body == BODY + b"%d" % offset
                        offset += 1
                        seen += 1
                for i in range(first, messages, 97):  # lookups by key all over the log
                    assert [m.body for m in store.query("t", f"k{i}").messages] == [BODY + b"%d" % i]
                counts.append(seen)
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.wait(60)
                go_on.wait(60)  # alive, its reader mapped, while the descriptors are counted

        before = _descriptors()
        threads = [threading.Thread(target=consume, args=(n * 100,)) for n in range(4)]
        for thread in threads:
            thread.start()
        done.wait(60)
        during = _descriptors()
        go_on.set()
        for thread in threads:
            thread.join(60)
        assert not errors, errors[0]
        assert sorted(counts) == [messages - n * 100 for n in range(3, -1, -1)]
        # Every thread read every segment; each holds at most `budget` maps (+ its queue and
        # index files), not one per segment.
        assert during - before <= 4 * (budget + 8), (during, before, segments)
