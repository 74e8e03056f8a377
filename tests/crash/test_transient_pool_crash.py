"""The transient store pool (write buffers, committed into the files by the commit service)
loses nothing acknowledged when the process is killed: PUT_OK comes once the put's bytes are
committed into the file's page cache. RocketMQ acknowledges a put while it is still in the
write buffer, and a kill -9 loses everything since the last commit (up to
commit_interval_commitlog_ms, and commit_commitlog_least_pages of data); here, before, so did
we."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import mqstore

SETTINGS = dict(
    transient_store_pool_enable=True,
    transient_store_pool_size=2,
    mapped_file_size_commitlog_bytes=1 << 20,
    # A commit tick that never comes while the child lives: only the put path can commit.
    commit_interval_commitlog_ms=60_000,
    commit_commitlog_thorough_interval_ms=60_000,
    commit_commitlog_least_pages=64,
)
N = 40

_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import mqstore
    settings = eval(sys.argv[2])
    store = mqstore.open(sys.argv[1], **settings)
    for i in range({n}):
        message = mqstore.Message(topic="T", body=b"m%d" % i)
        result = store.put(message) if i % 2 else store.put_async(message).result(timeout=10)
        assert result.ok, result
    batch = [mqstore.Message(topic="T", body=b"b%d" % i) for i in range(5)]
    assert store.put_batch(batch).ok
    sys.stdout.write("acknowledged\\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    """
).format(n=N)


def test_a_killed_process_loses_no_acknowledged_put_under_the_transient_store_pool(tmp_path: Path) -> None:
    """Single puts, pipelined puts and a batch, each answered, then the process kills itself
    before any commit tick: the reopened store has every one."""
    store_dir = tmp_path / "s"
    settings = dict(SETTINGS, flush_disk_type="ASYNC_FLUSH")  # the pool is off under SYNC_FLUSH
    done = subprocess.run([sys.executable, "-c", _CHILD, str(store_dir), repr(settings)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.stdout == "acknowledged\n", (done.returncode, done.stdout, done.stderr[-2000:])
    assert done.returncode == -9
    with mqstore.open(store_dir, **settings) as store:
        report = store.supervisor.recovery
        assert report is not None and not report.last_exit_ok
        expected = [b"m%d" % i for i in range(N)] + [b"b%d" % i for i in range(5)]
        assert store.wait_for_messages("T", 0, len(expected) - 1, timeout_s=10), store.max_offset("T", 0)
        bodies: list[bytes] = []
        while len(bodies) < len(expected):
            got = store.get("T", 0, len(bodies), 32)
            assert got.messages, got
            bodies += [m.body for m in got.messages]
        assert bodies == expected
