"""Helpers of the read-side tests, loaded by conftest.py as `mqstore_read_test_helpers`
(tests/ has no packages; importlib mode)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mqstore
from mqstore import Message, MessageStore

FIXTURES = Path("/work/shared/fixtures")
UNIT = 20  # ConsumeQueue unit size
# Small segments (a reopen scans the last one); a roll-over waits at most 200 ms for the allocator.
SMALL = {"allocate_wait_timeout_ms": 200, "mapped_file_size_commitlog_bytes": 1 << 20}
T0 = 1_700_000_000_000


@dataclass
class ManualClock:
    """A store clock the test moves by hand (`mqstore.open(..., clock_ms=clock)`)."""

    now_ms: int = T0

    def __call__(self) -> int:
        return self.now_ms


def put_n(store: MessageStore, n: int, *, topic: str = "T", queue_id: int = 0, body: bytes = b"x" * 100,
          tags: Callable[[int], str | None] = lambda i: None) -> list[mqstore.PutResult]:  # fmt: skip
    """Put n messages and wait (event-driven) until the queue has dispatched them all."""
    results = []
    for i in range(n):
        result = store.put(Message(topic=topic, queue_id=queue_id, body=body, tags=tags(i), keys=[f"k{i}"]))
        assert result.ok, result
        results.append(result)
    last = results[-1].queue_offset
    assert store.wait_for_messages(topic, queue_id, last, timeout_s=10)
    return results


def cq_dir(root: Path, topic: str = "T", queue_id: int = 0) -> Path:
    return root / "consumequeue" / topic / str(queue_id)


def segment_names(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if len(n) == 20 and n.isdigit())
