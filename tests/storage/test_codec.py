"""The record codec against the spec's worked examples and the real broker files (§2, §3, App. A, D)."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.storage import codec
from mqstore.storage.codec import HostAddress, RecordKind

FIXTURES = Path("/work/shared/fixtures")  # as conftest.py: a worktree is not two levels under /work
SAMPLES = [FIXTURES / "broker-sample-a" / "commitlog" / "00000000000000000000",
           FIXTURES / "broker-sample-b" / "commitlog" / "00000000000000000000"]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("TAG1", 2567159),
        ("TagA", 2598919),
        ("payment_success", -374754614),
        ("abc#hello", -1462968975),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -2147483648),  # Integer.MIN_VALUE
        ("\U0001f600", 1772899),  # non-BMP: two UTF-16 code units
        ("中文", 20013 * 31 + 25991),  # CJK: one unit each
    ],
)
def test_java_string_hash_matches_java(text: str, expected: int) -> None:
    assert codec.java_string_hash(text) == expected


def test_index_key_hash_maps_integer_min_value_to_zero() -> None:
    assert codec.index_key_hash("polygenelubricants") == 0
    assert codec.index_key_hash("abc#hello") == 1462968975


def test_body_crc_clears_the_sign_bit() -> None:
    assert codec.body_crc(b"hello") == 907060870
    assert codec.body_crc(b"Once, there was a chance for me!") == 151131488
    assert codec.body_crc(b"") == 0


def _reference_parse(s: str) -> dict[str, str]:
    """§2.3.2 literally: Java split on both separators, keep exactly-two-part pairs."""
    props = {}
    for item in codec.java_split(s, "\x02"):
        nv = codec.java_split(item, "\x01")
        if len(nv) == 2:
            props[nv[0]] = nv[1]
    return props


def test_parse_properties_equals_java_split_semantics_on_every_short_string() -> None:
    for n in range(7):
        for chars in itertools.product("a\x01\x02b", repeat=n):
            s = "".join(chars)
            assert codec.parse_properties(s) == _reference_parse(s), repr(s)


def test_properties_in_java_hashmap_order() -> None:
    # Appendix D's sample shows "0, KEYS, TAGS"; Appendix A's producer "KEYS, UNIQ_KEY, WAIT, TAGS".
    assert codec.java_hashmap_order(["TAGS", "KEYS", "0"]) == ["0", "KEYS", "TAGS"]
    assert codec.java_hashmap_order(["TAGS", "WAIT", "UNIQ_KEY", "KEYS"]) == ["KEYS", "UNIQ_KEY", "WAIT", "TAGS"]
    with pytest.raises(ValueError, match="separator"):
        codec.properties_to_string({"K": "a\x01b"})


def test_appendix_a_record_bytes() -> None:
    props = ("KEYS\x01order-1 order-2\x02UNIQ_KEY\x017F00000130392A9F1A2B0000EA600001\x02"
             "WAIT\x01true\x02TAGS\x01TagA\x02")  # fmt: skip
    data = codec.encode_message(
        topic="abc", queue_id=1, body=b"hello", properties=props, born_timestamp=1700000000000,
        born_host=HostAddress.parse("10.0.0.5:52000"), store_host=HostAddress.parse("192.168.1.10:10911"),
        store_timestamp=1700000000123, queue_offset=7, commitlog_offset=1073742336,
    )  # fmt: skip
    assert len(data) == 182
    assert data[:16].hex() == "000000b6daa320a73610a68600000001"
    assert data[0x30:0x40].hex() == "0a00000500 00cb2000 00018bcfe5687b".replace(" ", "")
    read = codec.read_record(data, 0, check_crc=True)
    assert read.kind is RecordKind.MESSAGE and read.record is not None
    assert read.record.msg_id == "C0A8010A00002A9F0000000040000200"
    assert read.record.key_list == ["order-1", "order-2"]
    assert read.record.tags_code() == 2598919


@pytest.mark.parametrize("path", SAMPLES, ids=["sample-a", "sample-b"])
def test_every_broker_record_decodes_and_reencodes_byte_for_byte(path: Path) -> None:
    data = path.read_bytes()
    pos = count = 0
    while True:
        read = codec.read_record(data, pos, check_crc=True)
        if read.kind is not RecordKind.MESSAGE:
            break
        assert read.record is not None
        assert codec.encode_record(read.record) == data[pos : pos + read.size]
        kind, size, fields = codec.read_dispatch(data, pos, len(data))
        assert (kind, size) == (RecordKind.MESSAGE, read.size) and fields is not None
        assert fields.tags_code == read.record.tags_code() == 2567159
        assert fields.keys == read.record.keys and fields.consume_queue_offset == count
        pos += read.size
        count += 1
    assert (count, read.kind, pos, read.size) == (47, RecordKind.BLANK, 8084, 108)


def _first_record() -> bytes:
    return SAMPLES[0].read_bytes()[:172]


@pytest.mark.parametrize(
    ("damage", "kind"),
    [
        (lambda d: d[:86], RecordKind.CORRUPT),  # cut in half
        (lambda d: d[:100] + bytes([d[100] ^ 0xFF]) + d[101:], RecordKind.CORRUPT),  # flipped body byte
        (lambda d: bytes(8) + d[8:], RecordKind.END_OF_DATA),  # zeroed header
        (lambda d: struct.pack(">i", 4000) + d[4:], RecordKind.CORRUPT),  # size past the end
        (lambda d: struct.pack(">i", 2**31 - 1) + d[4:], RecordKind.CORRUPT),  # huge size
    ],
    ids=["cut", "flipped-body", "zeroed-header", "size-past-end", "size-max-int"],
)
def test_damaged_records_are_reported_not_raised(damage: object, kind: RecordKind) -> None:
    data = damage(_first_record())  # type: ignore[operator]
    read = codec.read_record(data, 0, check_crc=True)
    assert read.kind is kind and read.offset == 0
    assert codec.read_dispatch(data, 0, len(data))[0] in (RecordKind.CORRUPT, RecordKind.END_OF_DATA, RecordKind.MESSAGE)


def test_ipv6_hosts_use_the_460_layout_and_round_trip() -> None:
    v6 = HostAddress.parse("[2001:db8::1]:10911")
    data = codec.encode_message(topic="t", queue_id=0, body=b"x", properties="", born_host=v6, store_host=v6)
    read = codec.read_record(data, 0)
    assert read.record is not None and read.record.born_host == v6 and read.record.store_host == v6
    assert read.record.sys_flag & (codec.BORNHOST_V6_FLAG | codec.STOREHOSTADDRESS_V6_FLAG) == 0x30
    assert len(read.record.msg_id) == 56
    assert codec.decode_msg_id(read.record.msg_id) == (v6, 0)


@pytest.mark.parametrize("bad", ["", "..", "a/b", "a\x00b", "x" * 128, "TBW102", "SCHEDULE_TOPIC_XXXX", "a b", "ä"])
def test_unsafe_or_reserved_topics_are_refused(bad: str) -> None:
    with pytest.raises(codec.TopicError):
        codec.validate_topic(bad)


def test_valid_topics_pass() -> None:
    for good in ("abc", "%RETRY%group", "a|b_c-1", "x" * 127):
        assert codec.validate_topic(good) == good


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=20)


@settings(max_examples=150, deadline=None)
@given(
    topic=st.from_regex(r"[a-zA-Z0-9_%|-]{1,40}", fullmatch=True),
    queue_id=st.integers(0, 2**31 - 1),
    body=st.binary(max_size=2048),
    props=st.dictionaries(_text.filter(bool), _text.filter(bool), max_size=6),
    flag=st.integers(-(2**31), 2**31 - 1),
    born=st.integers(0, 2**62),
    offsets=st.tuples(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62)),
)
def test_round_trip_of_arbitrary_messages(
    topic: str, queue_id: int, body: bytes, props: dict[str, str], flag: int, born: int,
    offsets: tuple[int, int, int],
) -> None:  # fmt: skip
    host = HostAddress.parse("127.0.0.1:10911")
    raw = codec.properties_to_string(props)
    data = bytearray(codec.encode_message(topic=topic, queue_id=queue_id, body=body, properties=raw, flag=flag,
                                          born_timestamp=born, born_host=host, store_host=host))  # fmt: skip
    codec.patch_record(data, 0, queue_offset=offsets[0], commitlog_offset=offsets[1], store_timestamp=offsets[2])
    read = codec.read_record(bytes(data), 0, check_crc=True)
    assert read.kind is RecordKind.MESSAGE and read.record is not None
    r = read.record
    assert (r.topic, r.queue_id, r.body, r.flag, r.born_timestamp) == (topic, queue_id, body, flag, born)
    assert (r.queue_offset, r.commitlog_offset, r.store_timestamp) == offsets
    assert r.properties == props
    assert codec.encode_record(r) == bytes(data)


def _as_v2(v1: bytes) -> bytes:
    """A 5.1+ V2 record (§17): V2 magic, 2-byte TOPICLENGTH, TOTALSIZE one larger."""
    body_len = struct.unpack_from(">i", v1, 84)[0]
    topic_at = 88 + body_len
    total = len(v1) + 1
    return (struct.pack(">ii", total, codec.MESSAGE_MAGIC_CODE_V2) + v1[8:topic_at]
            + struct.pack(">h", v1[topic_at]) + v1[topic_at + 1 :])  # fmt: skip


def test_v2_records_from_later_brokers_decode() -> None:
    v1 = _first_record()
    read = codec.read_record(_as_v2(v1), 0, check_crc=True)
    assert read.kind is RecordKind.MESSAGE and read.record is not None and read.record.is_v2
    original = codec.read_record(v1, 0).record
    assert original is not None
    assert (read.record.topic, read.record.body, read.record.properties) == (
        original.topic, original.body, original.properties)  # fmt: skip
    kind, size, fields = codec.read_dispatch(_as_v2(v1), 0, len(v1) + 1)
    assert (kind, size) == (RecordKind.MESSAGE, 173) and fields is not None and fields.keys == original.keys
    with pytest.raises(ValueError, match="V1"):
        codec.encode_record(read.record)  # a 4.4.0-compatible writer never writes V2


def test_integrity_checks_refuse_a_record_whose_properties_end_was_torn() -> None:
    """A power loss can persist the sectors holding header and body but not the one ending the
    properties (the body CRC still matches). Writers always end properties with \\x02."""
    host = codec.HostAddress("10.0.0.1", 10911)
    data = bytearray(
        codec.encode_message(
            topic="T", queue_id=0, body=b"body", properties="KEYS\x01order-17\x02TAGS\x01a\x02",
            born_host=host, store_host=host,
        )
    )  # fmt: skip
    data[-6:] = bytes(6)  # the tail of the properties never reached the disk
    assert codec.read_record(data, 0).kind is codec.RecordKind.MESSAGE  # readers are not stricter than Java
    torn = codec.read_record(data, 0, check_crc=True, read_body=True)
    assert torn.kind is codec.RecordKind.CORRUPT and "torn" in torn.reason
    assert codec.read_dispatch(data, 0, len(data), check_crc=True)[0] is codec.RecordKind.CORRUPT
    assert codec.read_dispatch(data, 0, len(data))[0] is codec.RecordKind.MESSAGE
