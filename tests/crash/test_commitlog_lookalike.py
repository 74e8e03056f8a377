"""Review 48 H2: `store_path_commitlog` set to another store's log that has this store's shape
(one producer feeding two brokers: same topic and queues, fixed-size messages) passed the
foreign-log check, because the ConsumeQueue units meet records of the same topic, queue,
queue offset and size wherever the two logs line up. `recover` then wrote filler segments into
the other store and cut this store's queues to its records.

The index says what the units cannot: each entry holds its message's key hash and store time
(the header's first and last messages' to the millisecond), which another store's record at
that offset does not share. And the other way: a store of our own, damaged, cleaned, crashed,
or without an index, is never refused for it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import Message
from mqstore.cli import main as cli_main
from mqstore.config import StoreConfig
from mqstore.storage.fs import RealFileSystem
from mqstore.storage.index import read_index_header
from mqstore.storage import recovery
from mqstore.storage.recovery import commitlog_not_this_stores

from crashlib import flushed_only_to, log_alone

FIXTURES = Path("/work/shared/fixtures")

# Small files: the digests read every file whole (a default index file is 420 MB).
_SMALL: dict[str, Any] = {"mapped_file_size_commitlog_bytes": 64 * 1024, "mapped_file_size_consume_queue_bytes": 2000,
                          "max_hash_slot_num": 1000, "max_index_num": 4000}  # fmt: skip


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def _producer(path: Path, n: int, seed: int, topics: tuple[str, ...] = ("orders",), **settings: Any) -> None:
    """review 47's mk2.py: fixed-size 256-byte random bodies, one 8-hex key each."""
    rnd = random.Random(seed)
    with mqstore.open(path, **{**_SMALL, **settings}) as store:
        for i in range(n):
            body = rnd.randbytes(256)
            assert store.put(Message(topics[i % len(topics)], body, tags="TagA", keys=["%08x" % rnd.getrandbits(32)])).ok


def _served(path: Path, topic: str = "orders", **settings: Any) -> int:
    served = 0
    with mqstore.open(path, **{**_SMALL, **settings}) as store:
        offset = 0
        while (got := store.get(topic, 0, offset, 32)).messages:
            served += len(got.messages)
            offset = got.next_begin_offset
    return served


def _verdict(path: Path, commitlog: Path | None = None, **settings: Any) -> str | None:
    kw = {**_SMALL, **settings}
    if commitlog is not None:
        kw["store_path_commitlog"] = str(commitlog)
    return commitlog_not_this_stores(StoreConfig(store_path_root_dir=str(path), **kw), RealFileSystem())


def _evidence(path: Path, commitlog: Path | None = None, **settings: Any) -> tuple[int, int]:
    """(records that are the messages this store's index entries name, other records there)."""
    found: list[tuple[int, int]] = []
    real = recovery._index_evidence

    def spy(*args: Any) -> tuple[int, int]:
        found.append(real(*args, exhaustive=True))  # every sampled entry, not only up to the first agreeing
        return found[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recovery, "_index_evidence", spy)
        _verdict(path, commitlog, **settings)
    assert len(found) == 1
    return found[0]


def _cli(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        for key, value in env.items():
            mp.setenv(key, value)
        code = cli_main(args)
    return code, err.getvalue()


@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """broker-a (400 messages) and broker-b (250): one producer's shape, other contents."""
    root = tmp_path_factory.mktemp("brokers")
    _producer(root / "BA", 400, 1)
    _producer(root / "BB", 250, 2)
    return root / "BA", root / "BB"


@pytest.mark.parametrize("how", ["open", "recover", "get", "query", "verify"])
def test_a_lookalike_log_of_another_store_is_refused_and_nothing_changes(
    tmp_path: Path, two_brokers: tuple[Path, Path], how: str
) -> None:
    """The reviewer's case: before, the verdict was None, `recover` wrote two filler segments
    into BB's commitlog and BA's queues pointed at BB's messages."""
    mine, other = tmp_path / "BA", tmp_path / "BB"
    shutil.copytree(two_brokers[0], mine)
    shutil.copytree(two_brokers[1], other)
    before = (_digest(mine), _digest(other))
    indexed, others = _evidence(mine, other / "commitlog")
    assert indexed == 0 and others >= 2
    if how == "open":
        with pytest.raises(mqstore.StoreDirectoryError, match="is not this store's.*store_path_commitlog"):
            mqstore.open(mine, store_path_commitlog=str(log_alone(other)), **_SMALL)
    else:
        extra = {"recover": ["--no-progress"], "get": ["--topic", "orders", "--queue", "0", "--offset", "0"],
                 "query": ["--topic", "orders", "--key", "00000000"], "verify": []}[how]  # fmt: skip
        args = ["recover", *extra, str(mine)] if how == "recover" else [how, str(mine), *extra]
        # Only the commitlog's place given: the files' geometry is adopted (a read-only command
        # checks the log before it adopts it).
        code, err = _cli(args, {"MQSTORE_STORE_PATH_COMMITLOG": str(log_alone(other))})
        assert code == 5 and "is not this store's" in err, (code, err[-2000:])
    assert (_digest(mine), _digest(other)) == before
    assert _served(mine) == 400 and _served(other) == 250


def test_a_lookalike_log_whose_topics_alternate_is_refused(tmp_path: Path, two_brokers: tuple[Path, Path]) -> None:
    """The reviewer's BB2: the other log alternates `orders,events`; `orders`' first unit
    met its first record."""
    other = tmp_path / "BB2"
    _producer(other, 250, 2, topics=("orders", "events"))
    before = _digest(other)
    assert _verdict(two_brokers[0], other / "commitlog") is not None
    with pytest.raises(mqstore.StoreDirectoryError, match="is not this store's"):
        mqstore.open(two_brokers[0], store_path_commitlog=str(log_alone(other)), **_SMALL)
    assert _digest(other) == before


def _broker_store(tmp_path: Path, sample: str) -> Path:
    """A store made from a RocketMQ broker's commitlog: the open dispatches its 47 messages."""
    store = tmp_path / sample
    (store / "commitlog").mkdir(parents=True)
    shutil.copy(FIXTURES / sample / "commitlog" / ("%020d" % 0), store / "commitlog")
    os.chmod(store / "commitlog" / ("%020d" % 0), 0o644)
    with mqstore.open(store, **{**_SMALL, "mapped_file_size_commitlog_bytes": 8192}) as s:
        for _ in range(200):
            if s.max_offset("abc", 0) >= 47 and s.query("abc", "1632821159368" if sample.endswith("a") else
                                                        "1551613204833").messages:  # fmt: skip
                break
            s.wait_for_messages("abc", 0, 46, 0.05)
    return store


@pytest.mark.parametrize(("mine", "theirs"), [("broker-sample-a", "broker-sample-b"), ("broker-sample-b", "broker-sample-a")])
def test_two_real_brokers_logs_of_one_shape_are_told_apart(tmp_path: Path, mine: str, theirs: str) -> None:
    """Two RocketMQ brokers fed by the same producer example: topic `abc`, 47 messages of 172
    bytes each, at the same offsets with the same queue offsets. Each store opens on its own
    log; neither on the other's."""
    settings = {**_SMALL, "mapped_file_size_commitlog_bytes": 8192}
    a, b = _broker_store(tmp_path, mine), _broker_store(tmp_path, theirs)
    assert read_index_header(RealFileSystem(), str(next((a / "index").iterdir()))).index_count > 40
    assert _verdict(a, **settings) is None and _verdict(b, **settings) is None
    assert _evidence(a, **settings)[1] == 0 and _evidence(b, **settings)[1] == 0
    before = (_digest(a), _digest(b))
    indexed, others = _evidence(a, b / "commitlog", **settings)
    assert indexed == 0 and others >= 2
    with pytest.raises(mqstore.StoreDirectoryError, match="is not this store's"):
        mqstore.open(a, store_path_commitlog=str(log_alone(b)), **settings)
    assert (_digest(a), _digest(b)) == before
    assert _served(a, "abc", **settings) == 47


# No false refusal: this store's own log, whatever happened to it.


def _header(path: Path) -> Any:
    return read_index_header(RealFileSystem(), str(next(p for p in (path / "index").iterdir() if p.name.isdigit())))


def _damage_record(path: Path, offset: int, how: str) -> None:
    segment = path / "commitlog" / ("%020d" % (offset - offset % _SMALL["mapped_file_size_commitlog_bytes"]))
    data = bytearray(segment.read_bytes())
    pos = offset % _SMALL["mapped_file_size_commitlog_bytes"]
    size = int.from_bytes(data[pos : pos + 4], "big")
    if how == "zeroed":
        data[pos : pos + size] = bytes(size)
    elif how == "garbage":
        data[pos : pos + size] = b"\xa5" * size
    else:  # torn: the record's second half gone
        data[pos + size // 2 : pos + size] = bytes(size - size // 2)
    segment.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["zeroed", "garbage", "torn"])
def test_a_store_whose_records_at_its_index_header_offsets_are_damaged_still_opens(tmp_path: Path, how: str) -> None:
    """The first and last indexed messages (the header's begin and end, whose store times it
    holds to the millisecond) damaged: damage says nothing."""
    path = tmp_path / "s"
    _producer(path, 300, 1)
    header = _header(path)
    for offset in (header.begin_phy_offset, header.end_phy_offset):
        _damage_record(path, offset, how)
    assert _verdict(path) is None
    indexed, others = _evidence(path)
    assert indexed > 0 and others == 0
    served = _served(path)
    assert 290 <= served <= 300


def test_a_store_whose_index_begins_in_a_cleaned_segment_still_opens(tmp_path: Path) -> None:
    """The cleaner deleted the oldest segments; the newest index file is never deleted, so its
    header and first entries point below the log's start."""
    path = tmp_path / "s"
    _producer(path, 1000, 1)  # ~290 KB: five 64 KiB segments
    segments = sorted((path / "commitlog").iterdir())
    for segment in segments[:3]:
        segment.unlink()
    assert _header(path).begin_phy_offset < int(segments[3].name)
    assert _verdict(path) is None
    indexed, others = _evidence(path)
    assert indexed > 0 and others == 0
    with mqstore.open(path, **_SMALL) as store:
        assert store.running and store.query("orders", "%08x" % _last_key(1000, 1)).messages


def _last_key(n: int, seed: int) -> int:
    rnd = random.Random(seed)
    key = 0
    for _ in range(n):
        rnd.randbytes(256)
        key = rnd.getrandbits(32)
    return key


_CRASH_CHILD = textwrap.dedent(
    """
    import random, sys, time
    import mqstore
    path, n = sys.argv[1], int(sys.argv[2])
    rnd = random.Random(1)
    store = mqstore.open(path, mapped_file_size_commitlog_bytes=65536, mapped_file_size_consume_queue_bytes=2000,
                         max_hash_slot_num=1000, max_index_num=4000)
    for i in range(n):
        assert store.put(mqstore.Message("orders", rnd.randbytes(256), keys=["%08x" % rnd.getrandbits(32)])).ok
    while store.query("orders", "%08x" % {last}).messages == []:
        time.sleep(0.01)
    print("READY", flush=True)
    time.sleep(60)
    """
)


def test_a_store_killed_while_running_still_opens_and_so_does_its_recovered_self(tmp_path: Path) -> None:
    """kill -9 with the index written up to the last message: checked before the crash
    recovery (the index file is not full: no evidence, as recovery does not trust it either)
    and again after it (which rebuilds the non-full index file)."""
    path = tmp_path / "s"
    code = _CRASH_CHILD.replace("{last}", str(_last_key(300, 1)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen([sys.executable, "-c", code, str(path), "300"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline() == "READY\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert (path / "abort").exists()
    assert _verdict(path) is None
    assert _evidence(path) == (0, 0)  # after a crash a file that is not full says nothing (review 50 H1)
    assert _served(path) == 300
    assert _verdict(path) is None
    assert _evidence(path)[0] > 0 and _evidence(path)[1] == 0
    assert _served(path) == 300


def test_a_store_whose_index_recovery_cut_back_still_opens(tmp_path: Path) -> None:
    """A clean stop and a lost unflushed tail: recovery cuts the index file's last entries and
    rewinds its endTimestamp to the second (begin + timeDiff * 1000), no longer its last
    message's store time to the millisecond."""
    path = tmp_path / "s"
    _producer(path, 300, 1)
    header = _header(path)
    queue_file = path / "consumequeue" / "orders" / "0" / ("%020d" % (280 * 20 // 2000 * 2000))
    unit = queue_file.read_bytes()[280 * 20 % 2000 :][:20]
    cut = int.from_bytes(unit[:8], "big")  # where message 280 starts
    segment = path / "commitlog" / ("%020d" % (cut - cut % 65536))
    data = bytearray(segment.read_bytes())
    data[cut % 65536 :] = bytes(len(data) - cut % 65536)
    segment.write_bytes(bytes(data))
    flushed_only_to(path, cut)  # a lost tail, not a hole
    assert _served(path) == 280
    after = _header(path)
    assert after.end_phy_offset < header.end_phy_offset and after.index_count == 281
    assert (after.end_timestamp - after.begin_timestamp) % 1000 == 0
    assert _verdict(path) is None
    indexed, others = _evidence(path)
    assert indexed > 0 and others == 0  # its newest entry's message too
    assert _served(path) == 280


@pytest.mark.parametrize("case", ["index_disabled", "no_keys"])
def test_a_store_without_index_evidence_is_checked_as_before(tmp_path: Path, case: str) -> None:
    """No index entries to compare (no evidence either way): the units decide, as before, and
    its own log opens."""
    path = tmp_path / "s"
    if case == "index_disabled":
        _producer(path, 300, 1, message_index_enable=False)
        assert not [p for p in (path / "index").iterdir() if p.name.isdigit()] if (path / "index").exists() else True
    else:
        with mqstore.open(path, **_SMALL) as store:
            rnd = random.Random(1)
            for _ in range(300):
                assert store.put(Message("orders", rnd.randbytes(256), tags="TagA")).ok
    settings = {"message_index_enable": False} if case == "index_disabled" else {}
    assert _verdict(path, **settings) is None
    assert _evidence(path, **settings) == (0, 0)
    assert _served(path, **settings) == 300


def test_broker_fixture_stores_open_on_their_own_logs(tmp_path: Path) -> None:
    for sample in ("broker-sample-a", "broker-sample-b"):
        store = _broker_store(tmp_path, sample)
        settings = {**_SMALL, "mapped_file_size_commitlog_bytes": 8192}
        assert _verdict(store, **settings) is None
        assert _evidence(store, **settings)[0] > 0 and _evidence(store, **settings)[1] == 0
        (store / "abort").touch()  # as after a crash
        assert _verdict(store, **settings) is None
        assert _served(store, "abc", **settings) == 47


_TORN_SETTINGS: dict[str, Any] = {"mapped_file_size_commitlog_bytes": 64 * 1024, "mapped_file_size_consume_queue_bytes": 20 * 200,
                                  "max_hash_slot_num": 64, "max_index_num": 400, "flush_disk_type": "ASYNC_FLUSH",
                                  "flush_interval_commitlog_ms": 3_600_000}  # fmt: skip


@pytest.mark.parametrize("abort_file", ["kept", "removed"])
def test_a_store_whose_records_lost_their_keys_to_a_power_loss_still_opens(abort_file: str) -> None:
    """Review 50 H1: a young ASYNC_FLUSH store loses power; its index pages reached the disk,
    of its commitlog only some 512-byte sectors (review 50's s10 image, replayed by a mask).
    Records whose header sectors survived but whose KEYS did not read as whole records of other
    keys, and two of them refused the store's own log (open, recover and every read-only
    command: exit 5). A record counts now only if written whole (body CRC, no NUL where a torn
    sector left zeros, a store time), and after a crash an index file that is not full gives
    no evidence (recovery drops it too): each rule alone lets the store open."""
    from mqstore.storage.fs import SimulatedFileSystem

    root, segment = "/sim/store", "/sim/store/commitlog/" + "0" * 20
    rng = random.Random(1)
    fs = SimulatedFileSystem()
    store = mqstore.open(root, fs=fs, **_TORN_SETTINGS)
    for i in range(12):
        keys = [f"order-key-{i:04d}-{j:08d}" for j in range(6)]
        assert store.put(Message("T", b"b" * rng.randint(300, 1200), queue_id=0, keys=keys)).ok
    assert store.query("T", "order-key-0011-00000005", 1).messages  # every key indexed
    crashed = fs.crash(0, tear=False)  # the durable bytes only; then the image as review 50 chose it
    with fs._lock:
        for path, f in fs._files.items():
            if "/index/" in path or "/consumequeue/" in path or path.endswith("checkpoint"):
                crashed._files[path].volatile[:] = f.volatile
                crashed._files[path].durable[:] = f.volatile
        torn = crashed._files[segment]
        torn.volatile[:] = bytes(len(torn.volatile))
        torn.durable[:] = bytes(len(torn.durable))
        for sector in (3, 5, 7, 9, 13, 14, 15, 21, 22, 23):
            kept = fs._files[segment].volatile[sector * 512 : (sector + 1) * 512]
            torn.volatile[sector * 512 : (sector + 1) * 512] = kept
            torn.durable[sector * 512 : (sector + 1) * 512] = kept
    store.close()
    if abort_file == "removed":  # the record rule alone (the crash rule would skip the file)
        crashed.remove(root + "/abort")
    cfg = StoreConfig(store_path_root_dir=root, **_TORN_SETTINGS)
    assert recovery._index_evidence(cfg, crashed, {0: segment}, exhaustive=True)[1] == 0
    assert commitlog_not_this_stores(cfg, crashed) is None
    mqstore.open(root, fs=crashed, **_TORN_SETTINGS).close()
