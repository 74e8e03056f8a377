"""Re-dispatch after a crash writes the same ConsumeQueue and index bytes through the C kernels
(dispatch_scan, dispatch_arrivals, cq_runs, index_put_batch) as through the pure-Python path,
which stays the reference (issue 18): on a generated store with records the C decoder leaves
to Python (IPv6 hosts) between plain ones, and on real brokers' commitlogs."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import Message
from mqstore.config import StoreConfig
from mqstore.storage import speedups

FIXTURES = Path("/work/shared/fixtures")
SETTINGS: dict[str, Any] = dict(
    mapped_file_size_commitlog_bytes=1 << 20,
    mapped_file_size_consume_queue_bytes=20 * 300,  # several files per queue
    max_hash_slot_num=97,
    max_index_num=500,  # several index files: roll-overs inside re-dispatch batches
)
needs_native = pytest.mark.skipif(speedups.native is None, reason="C extension not built or MQSTORE_PURE_PYTHON set")


def _messages(rng: random.Random, n: int) -> list[Message]:
    keys = ["k", "a", "中文", "\U0001f600z", "#"]
    out = []
    for i in range(n):
        extra: dict[str, Any] = {}
        roll = rng.random()
        if roll < 0.03:
            extra["born_host"] = "[::1]:9876"  # an IPv6 record: the Python decoder's
        elif roll < 0.05:
            extra["properties"] = {"app": "x" * rng.randrange(1, 40)}
        out.append(
            Message(
                topic=rng.choice(["T", "T2"]),
                queue_id=rng.randrange(3),
                body=rng.randbytes(rng.randrange(1, 200)),
                tags=rng.choice([None, "TagA", "標籤"]),
                keys=[f"{rng.choice(keys)}{i}" for _ in range(rng.randrange(3))],
                **extra,
            )
        )
    return out


def _crash(root: Path) -> None:
    """Leave the store as kill -9 would (the abort marker stays), with no index file: the
    index then needs every record again, so re-dispatch starts at the log's start and
    recovery truncates every queue to be written again."""
    cfg = StoreConfig.load(overrides={**SETTINGS, "store_path_root_dir": str(root)})
    Path(cfg.abort_path).touch()
    for name in os.listdir(cfg.index_dir):
        os.remove(os.path.join(cfg.index_dir, name))


def _derived(root: Path) -> dict[str, bytes]:
    """consumequeue/ by path; index/ files by their rank (their names are creation times)."""
    out = {}
    cq_root = root / "consumequeue"
    for dirpath, _, names in os.walk(cq_root):
        for name in names:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = path.read_bytes()
    for rank, name in enumerate(sorted(os.listdir(root / "index"))):
        out[f"index#{rank}"] = (root / "index" / name).read_bytes()
    return out


def _reopen(source: Path, target: Path, *, pure: bool, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any]) -> dict[str, bytes]:
    shutil.copytree(source, target)
    for dirpath, _, names in os.walk(target):
        for name in names:
            os.chmod(Path(dirpath) / name, 0o644)
    with monkeypatch.context() as m:
        if pure:
            m.setattr(speedups, "native", None)
        with mqstore.open(target, **settings):
            pass  # closing waits until dispatch caught up and flushed
    return _derived(target)


@needs_native
@pytest.mark.parametrize("seed", range(2))
def test_a_crashed_stores_queues_and_index_are_rebuilt_byte_for_byte_as_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    root = tmp_path / "store"
    with mqstore.open(root, **SETTINGS) as store:
        messages = _messages(rng, 2500)
        i = 0
        while i < len(messages):
            n = rng.choice([1, 1, 7, 32])
            group = [m._replace(topic=messages[i].topic, queue_id=messages[i].queue_id) for m in messages[i : i + n]]
            if n > 1 and not any(m.born_host or m.properties for m in group):
                assert store.put_batch(group).ok
            else:
                for m in group:
                    assert store.put(m).ok
            i += n
    _crash(root)
    native = _reopen(root, tmp_path / "c", pure=False, monkeypatch=monkeypatch, settings=SETTINGS)
    python = _reopen(root, tmp_path / "py", pure=True, monkeypatch=monkeypatch, settings=SETTINGS)
    assert sum(1 for name in native if name.startswith("index#")) > 3  # roll-overs happened
    assert sum(1 for name in native if name.startswith("consumequeue")) > 6
    assert native.keys() == python.keys()
    for name in native:
        assert native[name] == python[name], name


@needs_native
@pytest.mark.parametrize("sample", ["broker-sample-a", "broker-sample-b"])
def test_a_brokers_commitlog_is_dispatched_byte_for_byte_as_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sample: str
) -> None:
    source = tmp_path / "source"
    (source / "commitlog").mkdir(parents=True)
    shutil.copy(FIXTURES / sample / "commitlog" / "00000000000000000000", source / "commitlog")
    (source / "abort").touch()  # a crash: everything is dispatched again
    settings = {**SETTINGS, "mapped_file_size_commitlog_bytes": 8192}
    native = _reopen(source, tmp_path / "c", pure=False, monkeypatch=monkeypatch, settings=settings)
    python = _reopen(source, tmp_path / "py", pure=True, monkeypatch=monkeypatch, settings=settings)
    assert any(name.startswith("consumequeue") for name in native) and "index#0" in native
    assert native == python
