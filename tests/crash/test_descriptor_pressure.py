"""A store opened while the process is short of descriptors (review 76 H1): a host that holds
most of its `ulimit -n` (sockets at start-up) while it opens its store. The ConsumeQueue actor
took a queue whose file it could not open (EMFILE) for an empty queue; once descriptors were
back, the next put of that topic got queue offset 0 again and its unit went over the unit of an
acknowledged message: after a clean close and a normal reopen, those messages were gone from
their queues for good (142 in 68 of 100 topics in the reviewer's run).

Now a queue that cannot be loaded is never taken for an empty one: the open is refused with the
errno (EMFILE), nothing written, and the same open succeeds once descriptors are back; or, with
enough of them, it opens and every queue keeps its messages."""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path
from typing import Iterator

import pytest

import mqstore
from mqstore import Message

TOPICS, PER_TOPIC = 100, 3
SETTINGS = dict(
    mapped_file_size_commitlog_bytes=1024 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 100,
    max_hash_slot_num=1000,
    max_index_num=4000,
)


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def restore_nofile() -> Iterator[None]:
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.parent.name in {str(q) for q in range(8)}}  # fmt: skip


@pytest.mark.parametrize("free", [25, 40, 60, 400])
def test_an_open_short_of_descriptors_never_takes_a_queue_for_empty(tmp_path: Path, free: int, restore_nofile: None) -> None:
    root = tmp_path / "s"
    with mqstore.open(root, **SETTINGS) as store:
        for _ in range(PER_TOPIC):
            for i in range(TOPICS):
                assert store.put(Message(topic=f"t{i}", body=b"old", keys=[f"k{i}"])).ok
    queue_files = _files(root / "consumequeue")
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (_open_descriptors() + free, limits[1]))
    try:
        pressed = mqstore.open(root)
    except OSError as exc:  # refused: which errno, and nothing of the queues changed
        refused: OSError | None = exc
        assert exc.errno in (errno.EMFILE, errno.ENFILE), repr(exc)
        assert _files(root / "consumequeue") == queue_files
    else:
        refused = None
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)  # the host's burst is over
    if refused is not None:
        pressed = mqstore.open(root)  # the same open, once descriptors are back
    with pressed as store:
        for i in range(TOPICS):  # life goes on: one new message per topic
            result = store.put(Message(topic=f"t{i}", body=b"new"))
            assert result.ok and result.queue_offset == PER_TOPIC, (i, result)
    with mqstore.open(root) as store:
        for i in range(TOPICS):
            got = store.get(f"t{i}", 0, 0, 32)
            assert [(m.queue_offset, m.body) for m in got.messages] == [
                (0, b"old"), (1, b"old"), (2, b"old"), (3, b"new")], f"t{i}"  # fmt: skip
