"""A process file size limit (RLIMIT_FSIZE, `ulimit -f`) below what the store's files need, in a
host that restored SIGXFSZ's default action (CPython ignores it at start): the store grew its
files with ftruncate and pwrite past the limit, and the kernel's SIGXFSZ killed the host
(review 52 M2). Now each growth is checked first: puts are refused with the limit named in
their detail, the host lives, and everything acknowledged is there at the next open."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mqstore

SEGMENT = 4 << 20
SETTINGS = dict(mapped_file_size_commitlog_bytes=SEGMENT, mapped_file_size_consume_queue_bytes=6000, max_hash_slot_num=100,
                max_index_num=400)  # fmt: skip
CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    import mqstore
    path, limit = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # a host that wants the kernel's default
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    statuses, acked = {}, 0
    with mqstore.open(path, **json.loads(sys.argv[3])) as store:
        for i in range(300):
            result = store.put(mqstore.Message("T", b"x" * 20_000))
            statuses.setdefault(result.status.name, result.detail)
            acked += result.ok
    print(json.dumps({"statuses": statuses, "acked": acked}))
    """
)


def run_child(store: Path, limit: int) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(store), str(limit), json.dumps(SETTINGS)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -25: killed by SIGXFSZ
    answer: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return answer


@pytest.mark.parametrize("existing", [False, True], ids=["new store", "existing store"])
def test_a_file_size_limit_refuses_puts_and_never_kills_the_host(tmp_path: Path, existing: bool) -> None:
    store = tmp_path / "s"
    acked_before = 0
    if existing:  # written without the limit; the limit then falls inside its first segment
        with mqstore.open(store, **SETTINGS) as s:
            acked_before = sum(s.put(mqstore.Message("T", b"x" * 20_000)).ok for _ in range(20))
        limit = SEGMENT // 2
    else:
        limit = SEGMENT // 4  # below the first segment's size
    answer = run_child(store, limit)
    statuses = answer["statuses"]
    assert isinstance(statuses, dict)
    if not existing:  # its first segment is past the limit: nothing could be taken
        assert "PUT_OK" not in statuses, statuses
    refusals = [detail for status, detail in statuses.items() if status != "PUT_OK"]
    assert refusals and all("file size limit (RLIMIT_FSIZE" in detail for detail in refusals), statuses
    assert not any(detail.startswith("disk full") for detail in refusals), statuses  # (review 90 L3)
    acked = acked_before + int(answer["acked"])  # type: ignore[call-overload]
    with mqstore.open(store, **SETTINGS) as s:
        assert s.max_offset("T", 0) == acked
        if acked:
            assert len(s.get("T", 0, acked - 1, 1).messages) == 1


OFFSETS_CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    import mqstore
    path = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_FSIZE, (128 << 10, resource.RLIM_INFINITY))
    answer = {}
    store = mqstore.open(path, **json.loads(sys.argv[2]))
    answer["put"] = store.put(mqstore.Message("T", b"acknowledged")).status.name
    for group in range(100):
        for topic in range(40):
            store.commit_offset(f"group-{group}", f"topic-{topic}", 0, 1)
    try:
        store.persist_offsets()  # ~200 KiB of JSON: past the limit
    except OSError as exc:
        answer["persist"] = repr(exc)
    answer["close"] = store.close()
    print(json.dumps(answer))
    """
)


def test_files_written_whole_never_kill_the_host_past_the_limit(tmp_path: Path) -> None:
    """Review 90 M2: the committed offsets (and stats, the queue ledger, the index progress)
    are written whole to a temporary file, which was not checked against the limit: the
    offsets tick wrote consumerOffset.json past `ulimit -f` and SIGXFSZ killed the host."""
    settings = dict(mapped_file_size_commitlog_bytes=64 << 10, mapped_file_size_consume_queue_bytes=6000,
                    max_hash_slot_num=100, max_index_num=400)  # fmt: skip
    done = subprocess.run([sys.executable, "-c", OFFSETS_CHILD, str(tmp_path / "s"), json.dumps(settings)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -25: killed by SIGXFSZ
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["put"] == "PUT_OK"
    assert "file size limit (RLIMIT_FSIZE" in answer["persist"]
    assert answer["close"] is False  # the offsets could not be written: said, not hidden
    with mqstore.open(tmp_path / "s", **settings) as s:  # type: ignore[arg-type]
        assert [m.body for m in s.get("T", 0, 0, 4).messages] == [b"acknowledged"]
