"""The C kernels (storage/_native.c) against their Python twins, which stay the reference.

Each kernel either gives exactly the Python result or declines (stops, returns None) so the
Python path handles the case; these tests check both halves of that contract on generated
input, the brokers' own files and damaged bytes.
"""

from __future__ import annotations

import mmap
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.messages import Message
from mqstore.storage import codec, speedups
from mqstore.storage.codec import DispatchFields, RecordKind
from mqstore.storage.foreign import ForeignStoreError
from mqstore.storage.commitlog import CommitLog
from mqstore.storage.fs import RealFileSystem, SimulatedFileSystem
from mqstore.storage.index import IndexService
from mqstore.storage.put_encoding import message_properties

from .conftest import FIXTURES, ManualClock

native = speedups.native
needs_native = pytest.mark.skipif(native is None, reason="C extension not built or MQSTORE_PURE_PYTHON set")

STORE_HOST = codec.HostAddress("10.1.2.3", 10911)
BORN_HOST = codec.HostAddress("127.0.0.1", 0)
NOW = 1_700_000_000_123
MAX_SIZE = 4 * 1024 * 1024


def test_the_extension_is_built_unless_pure_python_was_asked_for() -> None:
    # `optional=True` lets an install without a compiler succeed; CI must not lose it silently.
    if speedups.pure_python_requested():
        assert native is None
    else:
        assert native is not None, "storage/_native.c was not built: `pip install -e .` needs a C compiler"


# ---- encode_batch ------------------------------------------------------------------------

_TEXT = st.text(
    alphabet=st.sampled_from(["a", "Z", "0", "-", " ", "\x01", "\x02", "é", "中", "\U0001f600", "#"]), max_size=8
)
_KEYS = st.one_of(st.none(), _TEXT, st.lists(_TEXT, max_size=4), st.lists(_TEXT, max_size=3).map(tuple))
_MESSAGES = st.builds(
    Message,
    topic=st.just("TopicA"),
    body=st.binary(max_size=300),
    queue_id=st.one_of(st.integers(0, 7), st.just(2**31 - 1)),
    tags=st.one_of(st.none(), _TEXT),
    keys=_KEYS,
    properties=st.one_of(st.just({}), st.just({"a": "b"})),
    flag=st.one_of(st.just(0), st.integers(-(2**31), 2**31 - 1)),
    born_timestamp_ms=st.one_of(st.none(), st.integers(0, 2**41)),
    born_host=st.one_of(st.none(), st.just(""), st.just("10.0.0.1:5")),
    wait_store_msg_ok=st.booleans(),
)


def _python_encode(m: Message) -> bytes | None:
    """The general path of storage.put_encoding.PutEncoder for one message; None where it rejects."""
    try:
        props = message_properties(m)
    except ValueError:
        return None
    if len(props) > codec.MAX_PROPERTIES_BYTES:
        return None
    try:
        return codec.encode_message(
            topic=m.topic, queue_id=m.queue_id, body=bytes(m.body), properties=props, flag=m.flag,
            born_timestamp=m.born_timestamp_ms if m.born_timestamp_ms is not None else NOW, born_host=BORN_HOST,
            store_host=STORE_HOST, max_message_size=MAX_SIZE,
        )  # fmt: skip
    except (codec.MessageTooLarge, codec.PropertiesTooLarge):
        return None


def _native_encode(messages: list[Message], max_size: int = MAX_SIZE) -> tuple[bytes, ...] | None:
    assert native is not None
    return native.encode_batch(  # type: ignore[no-any-return]
        messages, b"TopicA", NOW, BORN_HOST.address_bytes(), BORN_HOST.port, STORE_HOST.address_bytes(),
        STORE_HOST.port, max_size, "TopicA", messages[0].queue_id,
    )  # fmt: skip


@needs_native
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_MESSAGES, min_size=1, max_size=4))
def test_encode_batch_is_the_python_encoding_or_declines(messages: list[Message]) -> None:
    got = _native_encode(messages)
    if got is None:
        # Declining is right only for what the fast path does not cover.
        assert any(
            m.properties or not m.wait_store_msg_ok or m.born_host or _python_encode(m) is None
            or m.queue_id != messages[0].queue_id
            or any(c in (m.tags or "") for c in "\x01\x02")
            or (isinstance(m.keys, str) and any(c in m.keys for c in " \x01\x02"))
            or (not isinstance(m.keys, str) and any(not k or any(c in k for c in " \x01\x02") for k in (m.keys or ())))
            for m in messages
        ), messages  # fmt: skip
        return
    assert got == tuple(_python_encode(m) for m in messages)


@needs_native
def test_encode_batch_declines_what_the_python_path_reports() -> None:
    plain = Message(topic="TopicA", body=b"x", tags="t", keys=["k1", "k2"])
    assert _native_encode([plain]) == (_python_encode(plain),)
    unicode = Message(topic="TopicA", body=b"", tags="标签", keys="鍵\U0001f600", born_timestamp_ms=5, flag=-7)
    assert _native_encode([unicode, plain]) == (_python_encode(unicode), _python_encode(plain))
    for bad in (
        Message(topic="TopicA", body=b"x", keys=["a b"]),  # a space inside a key
        Message(topic="TopicA", body=b"x", keys=["a", ""]),  # an empty key
        Message(topic="TopicA", body=b"x", tags="a\x02b"),  # a separator
        Message(topic="TopicA", body=b"x", queue_id=-1),
        Message(topic="TopicA", body=bytearray(b"x")),  # not bytes: the general path converts
        Message(topic="TopicA", body=b"x", born_host="10.0.0.1:1"),
        Message(topic="TopicA", body=b"x" * 100, tags="t"),  # too large for max_size below
        Message(topic="TopicB", body=b"x"),  # another topic: a mixed batch
        Message(topic="TopicA", body=b"x", queue_id=3),  # another queue
    ):
        assert _native_encode([plain, bad], max_size=150) is None, bad


# ---- append_records -----------------------------------------------------------------------


@needs_native
@given(
    bodies=st.lists(st.binary(max_size=200), min_size=1, max_size=6),
    position=st.integers(0, 64),
    queue_offset=st.integers(0, 2**40),
    advances=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_append_records_writes_what_the_python_copy_writes(
    bodies: list[bytes], position: int, queue_offset: int, advances: bool
) -> None:
    assert native is not None
    datas = tuple(
        codec.encode_message(topic="T", queue_id=1, body=b, properties="", born_host=BORN_HOST, store_host=STORE_HOST)
        for b in bodies
    )
    size = position + sum(map(len, datas)) + 16
    ours, theirs = bytearray(os.urandom(size)), bytearray(size)
    theirs[:] = ours
    file_from = 3 * 1024 * 1024 * 1024
    ts_position = codec.store_timestamp_position(0)
    prefix = "0A01020300002A9F"
    ids = native.append_records(ours, position, datas, file_from, queue_offset, advances, NOW, ts_position, prefix)
    expected_ids = CommitLog._copy_and_patch(
        theirs, position, datas, file_from, queue_offset, advances, NOW, ts_position, prefix
    )
    assert ids == expected_ids
    assert ours == theirs


@needs_native
def test_append_records_refuses_what_does_not_fit() -> None:
    assert native is not None
    data = codec.encode_message(topic="T", queue_id=0, body=b"x", properties="", born_host=BORN_HOST, store_host=STORE_HOST)
    with pytest.raises(ValueError):
        native.append_records(bytearray(len(data) - 1), 0, (data,), 0, 0, True, NOW, 56, "")
    with pytest.raises(ValueError):
        native.append_records(bytearray(200), -1, (data,), 0, 0, True, NOW, 56, "")
    with pytest.raises(BufferError):
        native.append_records(bytes(200), 0, (data,), 0, 0, True, NOW, 56, "")  # read-only


# ---- dispatch_scan ------------------------------------------------------------------------

SCHEDULE = codec.SCHEDULE_TOPIC.encode()


Scanned = list[tuple["RecordKind | str", int, "DispatchFields | None"]]


# The dispatcher's C decoder (reput's and the recovery tally's).
KERNELS = ["dispatch_scan"]


def _scan(buf: Any, limit: int, *, use_native: bool, max_records: int = 7, kernel: str = "dispatch_scan") -> Scanned:
    """Records from 0 to the first non-message: by the Python decoder alone, or the reput
    loop's way (C while it can, the Python decoder for what it leaves)."""
    out: Scanned = []
    pos = 0
    while pos < limit:
        if use_native:
            assert native is not None
            decode = getattr(native, kernel)
            decoded, end = decode(buf, pos, limit, max_records, MAX_SIZE, DispatchFields, SCHEDULE)
            for fields in decoded:
                assert type(fields) is DispatchFields
                out.append((RecordKind.MESSAGE, pos, fields))
                pos += fields.msg_size
            assert pos == end
            if decoded:
                continue
        try:
            kind, size, fields = codec.read_dispatch(buf, pos, limit, MAX_SIZE)
        except ForeignStoreError:  # (a damaged sysflag may read as 5.x's INNER_BATCH: both paths refuse it)
            out.append(("refused", pos, None))
            break
        out.append((kind, pos, fields))
        if kind is not RecordKind.MESSAGE:
            break
        pos += size
    return out


def _python_scan(buf: Any, limit: int) -> Scanned:
    return _scan(buf, limit, use_native=False)


def _mixed_scan(buf: Any, limit: int, max_records: int = 7, kernel: str = "dispatch_scan") -> Scanned:
    return _scan(buf, limit, use_native=True, max_records=max_records, kernel=kernel)


_PROPS = st.lists(
    st.tuples(
        st.sampled_from(["KEYS", "UNIQ_KEY", "TAGS", "DELAY", "", "K\x01", "WAIT"]),
        st.sampled_from(["", "a", "b c", " x  y ", "中文", "\U0001f600", "\x01", "v\x01", "\x01\x01", "t\x02"]),
    ),
    max_size=5,
).map(lambda pairs: "".join(f"{k}\x01{v}\x02" for k, v in pairs))


@needs_native
@given(
    st.lists(
        st.tuples(st.binary(max_size=40), _PROPS, st.sampled_from(["T", "Topic中", codec.SCHEDULE_TOPIC]), st.integers(0, 3)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 7),
)
@settings(max_examples=300, deadline=None)
@pytest.mark.parametrize("kernel", KERNELS)
def test_dispatch_scan_decodes_as_read_dispatch(kernel: str, records: list[tuple[bytes, str, str, int]], cut: int) -> None:
    blob = b"".join(
        codec.encode_message(
            topic=topic, queue_id=qid, body=body, properties=props, born_host=BORN_HOST, store_host=STORE_HOST,
            queue_offset=i, commitlog_offset=1000 + i, store_timestamp=NOW + i,
        )
        for i, (body, props, topic, qid) in enumerate(records)
    ) + bytes(16)  # fmt: skip
    limit = len(blob) - cut  # sometimes cutting the zero tail, sometimes not
    assert _mixed_scan(blob, limit, kernel=kernel) == _python_scan(blob, limit)


@needs_native
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("sample", ["broker-sample-a", "broker-sample-b"])  # c has no commitlog
def test_dispatch_scan_on_a_brokers_commitlog(sample: str, kernel: str) -> None:
    path = FIXTURES / sample / "commitlog" / "00000000000000000000"
    data = path.read_bytes()
    expected = _python_scan(data, len(data))
    assert sum(1 for k, _, _ in expected if k is RecordKind.MESSAGE) > 10
    assert _mixed_scan(memoryview(data), len(data), max_records=1024, kernel=kernel) == expected


@needs_native
@pytest.mark.parametrize("kernel", KERNELS)
def test_dispatch_scan_on_damaged_bytes_matches_the_python_decoder(kernel: str) -> None:
    rng = random.Random(7)
    clean = b"".join(
        codec.encode_message(
            topic="T", queue_id=0, body=rng.randbytes(rng.randrange(60)), properties=f"KEYS\x01k{i}\x02TAGS\x01t\x02",
            born_host=BORN_HOST, store_host=STORE_HOST, commitlog_offset=i,
        )
        for i in range(20)
    )  # fmt: skip
    for _ in range(3000):
        damaged = bytearray(clean)
        for _ in range(rng.randrange(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        limit = rng.randrange(len(damaged) // 2, len(damaged) + 1)
        assert _mixed_scan(damaged, limit, kernel=kernel) == _python_scan(damaged, limit)


@needs_native
def test_dispatch_scan_hands_records_the_cycle_collector_need_not_walk() -> None:
    import gc

    assert native is not None
    blob = b"".join(
        codec.encode_message(
            topic="T", queue_id=1, body=b"x" * 10, properties=f"KEYS\x01k{i}\x02TAGS\x01t\x02", born_host=BORN_HOST,
            store_host=STORE_HOST, queue_offset=i, commitlog_offset=1000 + 200 * i, store_timestamp=NOW,
        )
        for i in range(5)
    )  # fmt: skip
    decoded, end = native.dispatch_scan(blob, 0, len(blob), 100, MAX_SIZE, DispatchFields, SCHEDULE)
    assert end == len(blob) and len(decoded) == 5
    assert not any(gc.is_tracked(r) for r in decoded)
    # Equal ints of consecutive records are one object: store time, size, tags code.
    assert len({id(r.store_timestamp) for r in decoded}) == 1
    assert len({id(r.msg_size) for r in decoded}) == 1
    assert len({id(r.tags_code) for r in decoded}) == 1
    assert [r.consume_queue_offset for r in decoded] == [0, 1, 2, 3, 4]


# ---- dispatch_arrivals --------------------------------------------------------------------


@needs_native
@pytest.mark.parametrize("seed", range(8))
def test_dispatch_arrivals_is_the_python_walk(seed: int) -> None:
    from mqstore.actors.reput import newest_per_queue

    assert native is not None
    rng = random.Random(seed)
    topics = ["T", "T", "Topic中", "".join(["T"])]  # an equal topic that is another object
    requests = []
    for i in range(rng.randrange(0, 300)):
        sys_flag = rng.choice([0] * 6 + [codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE, 0x08])
        topic = rng.choice(topics)
        requests.append(DispatchFields(topic, rng.randrange(3), 100 * i, 100, 0, NOW + rng.randrange(5),
                                       rng.randrange(1000), None, None, sys_flag, 0))  # fmt: skip
        for _ in range(rng.choice([0, 0, 5])):  # runs of one queue, as puts of a batch make them
            last = requests[-1]
            requests.append(last._replace(consume_queue_offset=last.consume_queue_offset + 1, store_timestamp=NOW + i))
    assert native.dispatch_arrivals(requests) == newest_per_queue(requests)
    assert native.dispatch_arrivals(tuple(requests)) == newest_per_queue(requests)


# ---- index_put_batch ----------------------------------------------------------------------


def _requests(rng: random.Random, n: int) -> tuple[DispatchFields, ...]:
    out = []
    phy = 0
    for i in range(n):
        keys = rng.choice([None, "", "k1", f"k{i} k{i + 1}", "  a  b ", "中 \U0001f600", f"x{rng.randrange(50)}"])
        uniq = rng.choice([None, f"U{i:08X}"])
        sys_flag = rng.choice([0, 0, 0, codec.TRANSACTION_ROLLBACK_TYPE, codec.TRANSACTION_PREPARED_TYPE])
        topic = rng.choice(["T", "Topic中"])
        out.append(DispatchFields(topic, 0, phy, 100, 0, NOW + 700 * i, i, keys, uniq, sys_flag, 0))
        phy += rng.choice([100, 100, 100, 0])  # an occasional repeat tests the endPhyOffset rule
    return tuple(out)


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_index_put_batch_writes_the_files_build_index_writes(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    requests = _requests(rng, 300)
    indexed_below = rng.choice([0, 0, 5000])
    cuts = [0]
    while cuts[-1] < len(requests):  # uneven batches, as dispatch hands them over
        cuts.append(min(len(requests), cuts[-1] + rng.randrange(1, 60)))
    images = []
    for use_native in (True, False):
        clock = ManualClock()
        fs = SimulatedFileSystem(clock_ms=clock)
        fs.makedirs("/s")
        service = IndexService(fs, "/s/index", clock_ms=clock, max_hash_slot_num=17, max_index_num=40)
        monkeypatch.setattr(speedups, "native", native if use_native else None)
        for start, stop in zip(cuts, cuts[1:]):
            assert service.build_index_batch(requests, start, stop, indexed_below)
            clock.advance(1)
        images.append({name: fs.read_bytes(f"/s/index/{name}") for name in fs.listdir("/s/index")})
    assert len(images[0]) > 3  # several roll-overs happened
    assert images[0] == images[1]


# ---- java_hash, msync ---------------------------------------------------------------------


@needs_native
@given(st.text(max_size=40) | st.text(alphabet=st.sampled_from(["a", "\ud800", "\udfff", "\U0010ffff", "é"])))
def test_java_hash_is_string_hashcode(s: str) -> None:
    assert native is not None
    assert native.java_hash(s) == codec.java_string_hash(s)


@needs_native
def test_msync_writes_back_and_checks_its_range(tmp_path: Path) -> None:
    assert native is not None
    region = RealFileSystem().map_file(str(tmp_path / "f"), 16 * mmap.PAGESIZE)
    region.buf[:5] = b"hello"
    native.msync(region.buf, 0, 16 * mmap.PAGESIZE)
    assert (tmp_path / "f").read_bytes()[:5] == b"hello"
    with pytest.raises(ValueError):
        native.msync(region.buf, 1, 10)  # not page-aligned
    with pytest.raises(ValueError):
        native.msync(region.buf, 0, 17 * mmap.PAGESIZE)
    region.close()


# ---- cq_runs ------------------------------------------------------------------------------


@needs_native
@pytest.mark.parametrize("seed", range(8))
def test_cq_runs_write_the_units_of_one_by_one_dispatch(seed: int) -> None:
    from mqstore.storage.consume_queue import ConsumeQueue

    assert native is not None
    rng = random.Random(seed)
    requests = []
    phy = 0
    next_cq = {("T", 0): 0, ("T", 1): 0, ("Ü", 0): 0}
    for _ in range(400):
        key = rng.choice(list(next_cq))
        cq = next_cq[key]
        roll = rng.random()
        if roll < 0.05:
            cq += rng.randrange(1, 4)  # a gap in the queue offsets
        elif roll < 0.08:
            cq = max(cq - 2, 0)  # a replayed, lower offset
        sys_flag = rng.choice([0] * 8 + [codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE, 0x08])
        if rng.random() < 0.05:
            phy -= 100  # a commitlog offset that does not rise (replay)
        requests.append(DispatchFields(key[0], key[1], phy, 120, rng.randrange(-5, 5), NOW, cq, None, None, sys_flag, 0))
        if sys_flag & codec.TRANSACTION_MASK not in (codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE):
            next_cq[key] = cq + 1
        phy += 120
    images = []
    for use_runs in (True, False):
        clock = ManualClock()
        fs = SimulatedFileSystem(clock_ms=clock)
        fs.makedirs("/s")
        queues = {
            key: ConsumeQueue(fs, key[0], key[1], "/s/cq", mapped_file_size=20 * 37, clock_ms=clock) for key in next_cq
        }
        if use_runs:
            for i in range(0, len(requests), 50):  # dispatch batches
                for topic, queue_id, units, first_phy, last_phy, first_cq, count in native.cq_runs(tuple(requests[i : i + 50])):
                    assert len(units) == 20 * count
                    assert queues[(topic, queue_id)].put_dense_run(units, first_phy, last_phy, first_cq, count)
        else:
            for r in requests:
                if r.sys_flag & codec.TRANSACTION_MASK in (codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE):
                    continue
                queues[(r.topic, r.queue_id)].put_message_position_info(
                    r.commitlog_offset, r.msg_size, r.tags_code, r.consume_queue_offset
                )
        images.append({f"{t}/{q}/{n}": fs.read_bytes(f"/s/cq/{t}/{q}/{n}") for (t, q) in next_cq for n in fs.listdir(f"/s/cq/{t}/{q}")})
    assert images[0] == images[1]
    assert sum(len(v) for v in images[0].values()) > 20 * 300


# ---- crc32: the CRC on read's kernel (issue 19) ---------------------------------------------


@needs_native
def test_crc32_is_zlibs_on_every_length_and_alignment() -> None:
    import zlib

    assert native is not None
    rng = random.Random(19)
    data = rng.randbytes(70_000)
    for length in [*range(300), 1023, 1024, 1025, 4096, 16_384, 65_536 + 7]:
        for start in range(0, 17, 5):
            view = memoryview(data)[start : start + length]
            assert native.crc32(view) == zlib.crc32(view), (length, start)
    assert native.crc32(b"\xff" * 1000) == zlib.crc32(b"\xff" * 1000)
    assert native.crc32(bytes(1000)) == zlib.crc32(bytes(1000))


@needs_native
@given(st.binary(max_size=3000))
def test_crc32_is_zlibs_on_generated_bytes(data: bytes) -> None:
    import zlib

    assert native is not None
    assert native.crc32(data) == zlib.crc32(data)
