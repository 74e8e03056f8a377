"""The read path's C decoder (`_native.decode_message`) against `codec.read_record`, the reference.

The contract: for a record read_record reports as MESSAGE, the C decoder builds the very same
MessageRecord (same values, types and property order, bytes copied out of the buffer); for
everything else it declines (None) and the caller runs read_record. Checked on generated
records (every field range, IPv4/IPv6 hosts, V1/V2, any topic and properties bytes), on the
brokers' own files at every byte offset, and on thousands of damaged copies.
"""

from __future__ import annotations

import mmap
import random
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mqstore
from mqstore import Message, MessageStore
from mqstore.storage import codec, speedups
from mqstore.storage.codec import MessageRecord, RecordKind
from mqstore.storage.commitlog import CommitLogReader
from mqstore.storage.fs import RealFileSystem

from .conftest import FIXTURES

native = speedups.native
needs_native = pytest.mark.skipif(native is None, reason="C extension not built or MQSTORE_PURE_PYTHON set")

MAX_SIZE = 4 * 1024 * 1024
SAMPLES = [FIXTURES / s / "commitlog" / "00000000000000000000" for s in ("broker-sample-a", "broker-sample-b")]


def _c_decode(
    buf: Any, pos: int, limit: int | None = None, max_size: int = MAX_SIZE, check_crc: bool = False
) -> MessageRecord | None:
    assert native is not None
    return native.decode_message(buf, pos, limit, max_size, MessageRecord, codec._host_from_bytes, check_crc)  # type: ignore[no-any-return]


def _assert_same_or_declined(buf: Any, pos: int, limit: int | None = None, max_size: int = MAX_SIZE) -> RecordKind:
    """The C decoder gives read_record's record exactly, and declines exactly what read_record
    does not report as MESSAGE (declining a good record would silently cost the fast path);
    with check_crc as without (the CRC on read, issue 19)."""
    _assert_same_or_declined_crc(buf, pos, limit, max_size, check_crc=True)
    return _assert_same_or_declined_crc(buf, pos, limit, max_size, check_crc=False)


def _assert_same_or_declined_crc(buf: Any, pos: int, limit: int | None, max_size: int, *, check_crc: bool) -> RecordKind:
    expected = codec.read_record(buf, pos, limit, max_message_size=max_size, check_crc=check_crc)
    got = _c_decode(buf, pos, limit, max_size, check_crc)
    if check_crc and expected.kind is RecordKind.MESSAGE:
        assert codec.body_crc_mismatch(buf, pos, limit) == "", expected
    if check_crc and codec.failed_integrity(expected):
        assert codec.body_crc_mismatch(buf, pos, limit) == expected.reason, expected
    if expected.kind is not RecordKind.MESSAGE:
        assert got is None, (expected, got)
        return expected.kind
    assert got is not None, expected
    want = expected.record
    assert want is not None
    assert type(got) is MessageRecord and got == want
    # == on the tuple hides what it does not see: property order and the fields' exact types.
    assert list(got.properties.items()) == list(want.properties.items())
    assert [type(v) for v in got] == [type(v) for v in want]
    assert type(got.body) is bytes and type(got.topic) is str and type(got.properties_raw) is str
    return RecordKind.MESSAGE


# ---- a raw record encoder: any bytes for topic and properties, V1 or V2 ---------------------


def _raw_record(
    *,
    body: bytes = b"body",
    topic: bytes = b"T",
    props: bytes = b"",
    born: tuple[bytes, int] = (b"\x7f\x00\x00\x01", 0),
    store: tuple[bytes, int] = (b"\x0a\x01\x02\x03", 10911),
    sys_flag: int = 0,
    v2: bool = False,
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    commitlog_offset: int = 0,
    born_ts: int = 0,
    store_ts: int = 0,
    reconsume: int = 0,
    prepared: int = 0,
) -> bytes:
    sys_flag &= ~(codec.BORNHOST_V6_FLAG | codec.STOREHOSTADDRESS_V6_FLAG)
    sys_flag |= (codec.BORNHOST_V6_FLAG if len(born[0]) == 16 else 0) | (
        codec.STOREHOSTADDRESS_V6_FLAG if len(store[0]) == 16 else 0
    )
    total = codec.cal_msg_length(len(body), len(topic), len(props), sys_flag, v2)
    magic = codec.MESSAGE_MAGIC_CODE_V2 if v2 else codec.MESSAGE_MAGIC_CODE
    return b"".join(
        (
            struct.pack(">iiiiiqqiq", total, magic, codec.body_crc(body), queue_id, flag, queue_offset,
                        commitlog_offset, sys_flag, born_ts),  # fmt: skip
            born[0],
            struct.pack(">iq", born[1], store_ts),
            store[0],
            struct.pack(">iiqi", store[1], reconsume, prepared, len(body)),
            body,
            # As Java's `(byte) topicLength`: a V1 topic past 127 bytes wraps to a negative length.
            struct.pack(">h", len(topic)) if v2 else bytes([len(topic) & 0xFF]),
            topic,
            struct.pack(">h", len(props)),
            props,
        )
    )


def test_the_raw_encoder_writes_what_encode_message_writes() -> None:
    # The generated records below are only as good as this encoder.
    born, store = codec.HostAddress("127.0.0.1", 7), codec.HostAddress("::1", 10911)
    expected = codec.encode_message(
        topic="Topic中", queue_id=3, body=b"xyz", properties="KEYS\x01k\x02", flag=-5, sys_flag=0x08,
        born_timestamp=11, born_host=born, store_host=store, store_timestamp=12, queue_offset=13,
        commitlog_offset=14, reconsume_times=15, prepared_transaction_offset=16,
    )  # fmt: skip
    assert expected == _raw_record(
        body=b"xyz", topic="Topic中".encode(), props=b"KEYS\x01k\x02", born=(born.address_bytes(), 7),
        store=(store.address_bytes(), 10911), sys_flag=0x08, queue_id=3, flag=-5, queue_offset=13,
        commitlog_offset=14, born_ts=11, store_ts=12, reconsume=15, prepared=16,
    )  # fmt: skip


# ---- generated records ----------------------------------------------------------------------

_I32 = st.integers(-(2**31), 2**31 - 1)
_I64 = st.integers(-(2**63), 2**63 - 1)
_HOST = st.tuples(st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16)), _I32)
_TRICKY = ["", "a", "KEYS", "TAGS", "UNIQ_KEY", "\x01", "v\x01", "\x01\x01", "t\x02", "中文", "\U0001f600", "é", " "]
_PAIRS = st.lists(st.tuples(st.sampled_from(_TRICKY), st.sampled_from(_TRICKY)), max_size=6).map(
    lambda pairs: "".join(f"{k}\x01{v}\x02" for k, v in pairs)
)
_SEPARATED = st.text(alphabet=st.sampled_from(["a", "b", "\x01", "\x02", "é", "\U0001f600", "\ufffd"]), max_size=24)
_PROPS = st.one_of(
    st.just(b""),
    _PAIRS.map(str.encode),
    _SEPARATED.map(str.encode),
    st.text(max_size=30).map(lambda s: s.encode("utf-8", "surrogatepass")),  # lone surrogates: "replace"d
    st.binary(max_size=40),  # not UTF-8 at all
    st.binary(max_size=10).map(lambda b: b"TAGS\x01" + b + b"\x02KEYS\x01k\x02"),
)
_TOPIC = st.one_of(
    st.sampled_from([b"T", b"TopicA", "Topic中".encode(), codec.SCHEDULE_TOPIC.encode()]),
    st.text(min_size=1, max_size=30).map(lambda s: s.encode("utf-8", "surrogatepass")[:127] or b"x"),
    st.binary(min_size=1, max_size=127),
    st.binary(min_size=128, max_size=400),  # V2 only: a V1 length byte wraps negative (CORRUPT)
)
_SYS_FLAG = st.one_of(
    st.sampled_from([0, codec.COMPRESSED_FLAG, codec.MULTI_TAGS_FLAG, codec.TRANSACTION_PREPARED_TYPE,
                     codec.TRANSACTION_COMMIT_TYPE, codec.TRANSACTION_ROLLBACK_TYPE, 0x40, 0x700]),  # fmt: skip
    _I32,
)
_RECORDS = st.builds(
    _raw_record,
    body=st.one_of(st.just(b""), st.binary(max_size=300)),
    topic=_TOPIC,
    props=_PROPS,
    born=_HOST,
    store=_HOST,
    sys_flag=_SYS_FLAG,
    v2=st.booleans(),
    queue_id=_I32,
    flag=_I32,
    queue_offset=_I64,
    commitlog_offset=_I64,
    born_ts=_I64,
    store_ts=_I64,
    reconsume=_I32,
    prepared=_I64,
)


@needs_native
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(_RECORDS, min_size=1, max_size=4),
    prefix=st.binary(max_size=9),
    tail=st.binary(max_size=9),
    exact_limit=st.booleans(),
)
def test_generated_records_decode_as_read_record(records: list[bytes], prefix: bytes, tail: bytes, exact_limit: bool) -> None:
    buf = prefix + b"".join(records) + tail
    pos = len(prefix)
    for data in records:
        limit = pos + len(data) if exact_limit else None
        _assert_same_or_declined(buf, pos, limit)
        _assert_same_or_declined(bytearray(buf), pos, limit)
        _assert_same_or_declined(memoryview(buf)[pos:], 0)
        pos += len(data)


@needs_native
@pytest.mark.parametrize(
    "props",
    [b"", b"\x02", b"\x01", b"\x01v\x02", b"k\x01\x02", b"k\x01v\x01\x02", b"k\x01v\x01\x01", b"a\x01b\x02a\x01c\x02",
     b"k\x01v", b"\x02\x02k\x01v\x02\x02", b"k\x01a\x01b\x02", b"\xff\x01\xfe\x02", b"\xe4\xb8\x01v\x02",
     "名\x01值\x02".encode(), b"\xed\xa0\x80\x01x\x02"],
)  # fmt: skip
def test_properties_edge_cases_split_as_parse_properties(props: bytes) -> None:
    assert _assert_same_or_declined(_raw_record(props=props), 0) is RecordKind.MESSAGE


@needs_native
@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("topic_len", [0, 127, 128, 255, 256])
def test_topic_lengths_at_the_edges(v2: bool, topic_len: int) -> None:
    # Empty is CORRUPT; a V1 length byte of 128..255 is negative (CORRUPT), a V2 one is not.
    kind = _assert_same_or_declined(_raw_record(topic=b"t" * topic_len, v2=v2), 0)
    assert (kind is RecordKind.MESSAGE) is (topic_len > 0 and (v2 or topic_len <= 127))


@needs_native
def test_a_negative_body_length_that_every_other_length_agrees_with_is_declined() -> None:
    # BODYLENGTH -8 puts the topic length at byte 80 (inside PREPAREDTRANSACTIONOFFSET), and
    # TOTALSIZE, topic and properties lengths are made to agree with it: only the sign
    # check of BODYLENGTH stands between this and a negative-size copy.
    data = bytearray(_raw_record(body=b"", topic=b"", props=b"")[:88] + bytes(4))
    struct.pack_into(">i", data, 0, 92)
    data[80] = 7  # topic length; the topic is bytes 81..88
    struct.pack_into(">i", data, 84, -8)
    struct.pack_into(">h", data, 88, 2)  # properties length; the properties are bytes 90..92
    data[90:92] = b"a\x02"
    assert codec.read_record(data, 0).kind is RecordKind.CORRUPT
    assert _assert_same_or_declined(data, 0) is RecordKind.CORRUPT


@needs_native
@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("born_v6", [False, True])
@pytest.mark.parametrize("store_v6", [False, True])
def test_every_host_layout_decodes(v2: bool, born_v6: bool, store_v6: bool) -> None:
    born = (bytes(range(16)) if born_v6 else b"\x01\x02\x03\x04", -7)
    store = (bytes(range(16, 32)) if store_v6 else b"\xc0\xa8\x00\x01", 2**31 - 1)
    data = _raw_record(born=born, store=store, v2=v2, props=b"TAGS\x01t\x02", body=b"\x00" * 5)
    assert _assert_same_or_declined(data, 0) is RecordKind.MESSAGE
    record = _c_decode(data, 0)
    assert record is not None
    assert record.born_host.address_bytes() == born[0] and record.born_host.port == -7
    assert record.store_host.address_bytes() == store[0] and record.is_v2 is v2


# ---- the brokers' own files -------------------------------------------------------------------


@needs_native
@pytest.mark.parametrize("path", SAMPLES, ids=["sample-a", "sample-b"])
def test_a_brokers_commitlog_decodes_as_read_record_at_every_offset(path: Path) -> None:
    data = path.read_bytes()
    kinds = [_assert_same_or_declined(data, pos) for pos in range(len(data) + 1)]
    assert kinds.count(RecordKind.MESSAGE) == 47  # each record, and nothing between them
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert _assert_same_or_declined(mapped, 172) is RecordKind.MESSAGE
        record = _c_decode(mapped, 172)
    assert record is not None and record.tags == "TAG1" and record.keys


# ---- damaged copies ---------------------------------------------------------------------------


def _clean_log(rng: random.Random) -> tuple[bytes, list[int]]:
    """Varied records back to back (IPv4/IPv6, V1/V2, properties or none) and their starts."""
    records = []
    for i in range(16):
        records.append(
            _raw_record(
                body=rng.randbytes(rng.randrange(40)),
                topic=rng.choice([b"T", b"TopicA", "Topic中".encode()]),
                props=rng.choice([b"", f"KEYS\x01k{i}\x02TAGS\x01t\x02".encode(), b"UNIQ_KEY\x01ABC\x02"]),
                born=(rng.randbytes(rng.choice([4, 16])), rng.randrange(1 << 16)),
                store=(rng.randbytes(rng.choice([4, 4, 16])), 10911),
                sys_flag=rng.choice([0, 0, codec.TRANSACTION_PREPARED_TYPE, codec.COMPRESSED_FLAG]),
                v2=rng.random() < 0.2,
                commitlog_offset=i,
            )
        )
    starts = [0]
    for data in records:
        starts.append(starts[-1] + len(data))
    return b"".join(records) + bytes(16), starts[:-1]


def _damage(rng: random.Random, clean: bytes, starts: list[int]) -> tuple[bytearray, int]:
    """One damaged copy and a limit: flipped bytes, a length field rewritten, or a cut."""
    damaged = bytearray(clean)
    limit = len(damaged)
    how = rng.randrange(4)
    if how == 0:
        for _ in range(rng.randrange(1, 4)):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
    elif how == 1:
        for _ in range(rng.randrange(1, 3)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
    elif how == 2:
        # A length or flag field of one record: TOTALSIZE, SYSFLAG, BODYLENGTH, or the topic
        # and properties lengths (found through the record's own, still clean, body length).
        start = rng.choice(starts)
        read = codec.read_record(clean, start)
        assert read.record is not None
        r = read.record
        topic_len_width = 2 if r.is_v2 else 1
        props_len_at = start + read.size - len(r.properties_raw.encode()) - 2
        topic_len_at = props_len_at - len(r.topic.encode()) - topic_len_width
        body_len_at = topic_len_at - len(r.body) - 4
        at, width = rng.choice([(start, 4), (start + 36, 4), (body_len_at, 4), (topic_len_at, topic_len_width),
                                (props_len_at, 2)])  # fmt: skip
        value = rng.choice([0, 1, -1, 91, 92, 127, 128, 255, 2**15 - 1, rng.randrange(300), rng.randrange(-(2**31), 2**31)])
        damaged[at : at + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "big")
    else:
        limit = rng.randrange(len(damaged))
        if rng.random() < 0.5:
            del damaged[limit:]
    return damaged, limit


@needs_native
@pytest.mark.parametrize("seed", range(4))
def test_damaged_copies_decode_as_read_record_or_are_declined(seed: int) -> None:
    rng = random.Random(seed)
    clean, starts = _clean_log(rng)
    seen: set[RecordKind] = set()
    for _ in range(1500):
        damaged, limit = _damage(rng, clean, starts)
        for start in starts:
            seen.add(_assert_same_or_declined(damaged, start, limit))
        _assert_same_or_declined(damaged, rng.randrange(len(damaged)), limit)
        _assert_same_or_declined(damaged, 0, limit, max_size=rng.choice([91, 120, 200]))
    assert {RecordKind.MESSAGE, RecordKind.CORRUPT, RecordKind.END_OF_DATA} <= seen


@needs_native
def test_declines_positions_and_limits_outside_the_buffer() -> None:
    data = _raw_record()
    assert _c_decode(data, 0) is not None
    for pos, limit in [(len(data), None), (0, len(data) - 1), (0, 0), (0, -5), (1, None), (len(data) - 7, None)]:
        assert _assert_same_or_declined(data, pos, limit) is not RecordKind.MESSAGE
    assert _c_decode(data, 0, max_size=len(data) - 1) is None
    # Python indexes from the end for a negative position (and may raise): whatever it does,
    # it does it itself.
    for pos in (-1, -len(data)):
        assert _c_decode(data, pos) is None


# ---- what the result holds and what the call leaves behind -------------------------------------


@needs_native
def test_bytes_fields_are_copies_and_the_buffer_is_released() -> None:
    buf = bytearray(_raw_record(body=b"original", props=b"TAGS\x01t\x02") + bytes(8))
    record = _c_decode(buf, 0)
    assert record is not None
    buf[88:96] = b"changed!"
    assert record.body == b"original"
    del buf[-8:]  # resizing raises BufferError while an export is held: none is
    assert _c_decode(buf, 1) is None
    buf.append(0)


@needs_native
def test_a_failing_host_factory_raises_and_releases_the_buffer() -> None:
    assert native is not None
    buf = bytearray(_raw_record(born=(b"\x09\x09\x09\x09", 1)))

    def broken(address: bytes, port: int) -> codec.HostAddress:
        raise RuntimeError("no hosts today")

    with pytest.raises(RuntimeError, match="no hosts today"):
        native.decode_message(buf, 0, None, MAX_SIZE, MessageRecord, broken)
    buf.append(0)  # no export left behind


@needs_native
def test_hosts_come_from_the_factory_given_even_for_repeated_addresses() -> None:
    assert native is not None
    data = _raw_record()
    plain = _c_decode(data, 0)
    assert plain is not None and plain.born_host == codec.HostAddress("127.0.0.1", 0)

    def tagged(address: bytes, port: int) -> codec.HostAddress:
        return codec.HostAddress("tagged", port)

    record = native.decode_message(data, 0, None, MAX_SIZE, MessageRecord, tagged)
    assert record.born_host.ip == record.store_host.ip == "tagged"
    again = _c_decode(data, 0)
    assert again is not None and again.born_host == codec.HostAddress("127.0.0.1", 0)
    for a, b in [((b"\x01\x01\x01\x01", 5), (b"\x01\x01\x01\x01", 6)), ((b"\x01\x01\x01\x01", 5), (b"\x01\x01\x01\x02", 5))]:
        first, second = _c_decode(_raw_record(born=a), 0), _c_decode(_raw_record(born=b), 0)
        assert first is not None and second is not None
        assert first.born_host == codec.HostAddress.from_bytes(*a) and second.born_host == codec.HostAddress.from_bytes(*b)


@needs_native
def test_refuses_a_record_class_that_is_not_a_tuple() -> None:
    assert native is not None
    with pytest.raises(TypeError):
        native.decode_message(_raw_record(), 0, None, MAX_SIZE, dict, codec._host_from_bytes)


# ---- codec.read_message and CommitLogReader.select ------------------------------------------------


@pytest.fixture(params=["native", "python"])
def either_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "native" and native is None:
        pytest.skip("C extension not built or MQSTORE_PURE_PYTHON set")
    monkeypatch.setattr(speedups, "native", native if request.param == "native" else None)
    yield request.param


def test_read_message_is_read_records_message_on_either_path(either_path: str) -> None:
    rng = random.Random(3)
    clean, starts = _clean_log(rng)
    for _ in range(300):
        damaged, limit = _damage(rng, clean, starts)
        for start in starts:
            read = codec.read_record(damaged, start, limit)
            assert codec.read_message(damaged, start, limit) == (read.record if read.kind is RecordKind.MESSAGE else None)


def test_select_locates_what_read_reads(tmp_path: Path) -> None:
    fs = RealFileSystem()
    size = 4096
    for start in (0, size * 2):  # a gap: the middle segment is missing
        with open(tmp_path / codec.segment_file_name(start), "wb") as f:
            f.write(random.Random(start).randbytes(size))
    reader = CommitLogReader(fs, str(tmp_path), mapped_file_size=size)
    try:
        for offset, n in [(0, 10), (100, 0), (size - 4, 4), (size - 4, 5), (size, 4), (2 * size + 5, 100),
                          (3 * size, 1), (7, -1), (3 * size - 1, 1)]:  # fmt: skip
            place = reader.select(offset, n)
            data = reader.read(offset, n, limit=offset + n)
            if data is None:
                assert place is None, (offset, n)
            else:
                assert place is not None
                buf, pos = place
                assert bytes(buf[pos : pos + n]) == data
        reader._regions[0].close()  # unmapped underneath: read and select both say so
        assert reader.read(0, 4, limit=4) is None and reader.select(0, 4) is None
    finally:
        reader.close()


# ---- the store's reads on both paths --------------------------------------------------------------


def _store_reads(store: MessageStore) -> list[object]:
    out: list[object] = []
    for offset in range(0, 40, 7):
        for tags in (None, "A", "B||C", "*"):
            for raw in (False, True):
                out.append(store.get("T", 0, offset, 8, tags=tags, raw=raw))
    out.append(store.query("T", "k3"))
    out.append(store.query("T", "k7"))
    first = store.get("T", 0, 0, 64).messages
    for record in first:
        out.append(store.lookup(record.commitlog_offset))
        out.append(store.lookup_msg_id(record.msg_id))
    out.extend(store.lookup(record.commitlog_offset + 1) for record in first[:5])  # not a record start
    return out


@needs_native
def test_get_query_and_lookup_give_the_same_results_on_both_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = mqstore.open(tmp_path / "store", mapped_file_size_commitlog_bytes=1 << 20)
    try:
        for i in range(40):
            message = Message(
                topic="T", body=bytes([i]) * (i * 7), tags=["A", "B", "C", None][i % 4], keys=[f"k{i}", f"k{i % 5}"],
                properties={"uid": f"U-{i}", "note": "中文"} if i % 3 else {},  # UNIQ_KEY is the store's (issue 19)
            )  # fmt: skip
            assert store.put(message).ok
        assert store.wait_for_messages("T", 0, 39, timeout_s=10)
        fast = _store_reads(store)
        monkeypatch.setattr(speedups, "native", None)
        reference = _store_reads(store)
    finally:
        store.close()
    assert fast == reference
    looked_up = [r for r in fast if isinstance(r, MessageRecord)]
    assert len(looked_up) >= 2 * 32 and all(type(r.body) is bytes for r in looked_up)
    assert sum(1 for r in fast if r is None) == 5  # the lookups between record starts


# ---- the CRC on read (issue 19 item 4) ------------------------------------------------------


@pytest.mark.parametrize("either_path", ["native", "python"])
def test_a_flipped_body_byte_is_served_only_without_check_crc(either_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if either_path == "python":
        monkeypatch.setattr(speedups, "native", None)
    elif native is None:
        pytest.skip("C extension not built")
    good = _raw_record(body=b"hello world" * 10, props=b"KEYS\x01k\x02")
    assert codec.read_message(good, 0, check_crc=True) is not None
    assert codec.body_crc_mismatch(good, 0) == ""
    bad = bytearray(good)
    bad[88 + 5] ^= 0x01  # a bit of the body
    assert codec.read_message(bad, 0) is not None  # the CRC is not read unless asked for
    assert codec.read_message(bad, 0, check_crc=True) is None
    served = codec.read_served(bad, 0, check_crc=True)
    assert isinstance(served, codec.RecordRead) and served.kind is RecordKind.CORRUPT
    assert served.reason == "body CRC mismatch"
    assert codec.body_crc_mismatch(bad, 0) == "body CRC mismatch"
    torn = bytearray(good)
    torn[-1] = 0  # the properties' last separator: a torn write the body CRC cannot see
    assert codec.read_message(torn, 0) is not None and codec.read_message(torn, 0, check_crc=True) is None
    assert codec.body_crc_mismatch(torn, 0) != ""
    zeroed = bytearray(good)
    zeroed[88 : 88 + 20] = bytes(20)
    assert codec.read_message(zeroed, 0, check_crc=True) is None


def test_body_crc_mismatch_reports_what_is_not_a_record() -> None:
    assert codec.body_crc_mismatch(bytes(200), 0) != ""
    v6 = _raw_record(born=(bytes(15) + b"\x01", 1), props=b"a\x01b\x02")
    assert codec.body_crc_mismatch(v6, 0) == ""
    bad = bytearray(v6)
    bad[100] ^= 0xFF
    assert codec.body_crc_mismatch(bad, 0) != ""
