"""A key lookup's C path (issue 18) against the Python reference, on the same bytes:

- `_native.index_query`, the walk of every index file a reader maps (`IndexReader.query_offset`),
  against `query_offset_in_files` over the same maps: the same offsets in the same order and the
  same last-update fields, on files built by put_key (hash collisions, non-ASCII keys, time
  windows, max_num, several files) and on damaged files (garbage headers, slots and chains).
- `_native.decode_keyed`, a hit's decode with queryMessage's key check, against decode_message
  and `record.uniq_key == key or key in record.key_list`, on a broker's own records, generated
  ones and damaged copies.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.storage import codec, speedups
from mqstore.storage.codec import MessageRecord
from mqstore.storage.fs import SimulatedFileSystem
from mqstore.storage.index import IndexFile, IndexReader, QueryOffsetResult

from .conftest import FIXTURES
from .test_native_decode import MAX_SIZE, _clean_log, _damage, _raw_record

native = speedups.native
pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built or MQSTORE_PURE_PYTHON=1")
T0 = 1_700_000_000_123
SLOTS, ENTRIES = 5, 24
# Aa/BB share one Java hash; the last ones are not ASCII (one outside the BMP: a surrogate pair).
KEYS = ["a", "b", "Aa", "BB", "ключ", "\U0001f600", "k" * 40]
SAMPLES = [FIXTURES / s / "commitlog" / "00000000000000000000" for s in ("broker-sample-a", "broker-sample-b")]


def _reader(files: list[list[tuple[str, str, int, int]]], damage: list[tuple[int, int, int]]) -> IndexReader:
    """Index files on a simulated disk, oldest first, each with its puts (topic, key, phy,
    time offset), then bytes overwritten through the owner's map; and a reader mapping them."""
    fs = SimulatedFileSystem()
    fs.makedirs("/i")
    owners = []
    for n, puts in enumerate(files):
        f = IndexFile.create(fs, f"/i/2024010100000{n:04d}", max_hash_slot_num=SLOTS, max_index_num=ENTRIES)
        for topic, key, phy, dt in puts:
            f.put_key(f"{topic}#{key}", phy, T0 + 10_000 * n + dt)
        owners.append(f)
    for which, at, value in damage:
        buf = owners[which % len(owners)]._buf
        buf[at % len(buf)] = value
    reader = IndexReader(fs, "/i", max_hash_slot_num=SLOTS, max_index_num=ENTRIES)
    assert reader.sync(tuple(f.name for f in owners))
    return reader


def _outcome(reader: IndexReader, *args: Any) -> QueryOffsetResult | str | None:
    try:
        return reader.query_offset(*args)
    except Exception as exc:  # noqa: BLE001 - the outcome compared
        return type(exc).__name__


def _python_outcome(reader: IndexReader, monkeypatch: pytest.MonkeyPatch, *args: Any) -> QueryOffsetResult | str | None:
    with monkeypatch.context() as m:
        m.setattr(speedups, "native", None)
        return _outcome(reader, *args)


_puts = st.lists(
    st.tuples(
        st.sampled_from(["t", "u"]),
        st.one_of(st.sampled_from(KEYS[:2]), st.sampled_from(KEYS)),  # long chains, and collisions
        st.integers(0, 2**40),
        st.one_of(st.sampled_from([-3_000, 0, 5_000, 9_000]), st.integers(-5_000, 30_000)),
    ),
    max_size=ENTRIES,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(_puts, min_size=0, max_size=3),
    damage=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 40 + SLOTS * 4 + ENTRIES * 20 - 1), st.integers(0, 255)),
        max_size=4,
    ),
    topic=st.sampled_from(["t", "u"]),
    key=st.one_of(st.sampled_from(KEYS[:2]), st.sampled_from(KEYS + ["none"])),
    max_num=st.integers(1, 80),
    window=st.tuples(
        st.one_of(st.sampled_from([0, 4_000, 10_000, 25_000]), st.integers(-10_000, 60_000)),
        st.one_of(st.sampled_from([10**9, 15_000]), st.integers(-10_000, 60_000)),
    ),
)
def test_the_c_query_finds_what_the_python_walk_finds(
    monkeypatch: pytest.MonkeyPatch,
    files: list[list[tuple[str, str, int, int]]],
    damage: list[tuple[int, int, int]],
    topic: str,
    key: str,
    max_num: int,
    window: tuple[int, int],
) -> None:
    reader = _reader(files, damage if files else [])
    args = (topic, key, max_num, T0 + window[0], T0 + window[1])
    reference = _python_outcome(reader, monkeypatch, *args)
    assert _outcome(reader, *args) == reference


def test_the_c_query_walks_newest_first_and_stops_at_max_num() -> None:
    assert native is not None
    reader = _reader([[("t", "k", 10 + i, i) for i in range(3)], [("t", "k", 20 + i, i) for i in range(3)]], [])
    everything = ("t", "k", 32, 0, 2**62)
    assert reader.query_offset(*everything) == ([22, 21, 20, 12, 11, 10], T0 + 10_002, 22)
    assert reader.query_offset("t", "k", 4, 0, 2**62) == ([22, 21, 20, 12], T0 + 10_002, 22)
    assert reader.query_offset("t", "other", 32, 0, 2**62) == ([], T0 + 10_002, 22)
    # No files: nothing, and no last-update fields.
    assert native.index_query((), "t", "k", SLOTS, 40 + SLOTS * 4, ENTRIES - 1, 32, 0, 2**62) == ([], 0, 0)


def test_the_c_query_declines_where_a_slot_or_an_entry_lies_outside_the_map() -> None:
    assert native is not None
    reader = _reader([[("t", "k", 10 + i, i) for i in range(3)]], [])
    bufs = reader._bufs
    entries_pos = 40 + SLOTS * 4
    assert native.index_query(bufs, "t", "k", SLOTS, entries_pos, ENTRIES - 1, 32, 0, 2**62) == ([12, 11, 10], T0 + 2, 12)
    # entries past the map, a header cut short: the Python walk decides (and raises) there
    assert native.index_query(bufs, "t", "k", SLOTS, entries_pos + 10_000, ENTRIES - 1, 32, 0, 2**62) is None
    assert native.index_query((b"\0" * 39,), "t", "k", SLOTS, entries_pos, ENTRIES - 1, 32, 0, 2**62) is None
    with pytest.raises(TypeError):
        native.index_query(list(bufs), "t", "k", SLOTS, entries_pos, ENTRIES - 1, 32, 0, 2**62)
    with pytest.raises(ValueError):
        native.index_query(bufs, "t", "k", 0, entries_pos, ENTRIES - 1, 32, 0, 2**62)


# ---- decode_keyed ---------------------------------------------------------------------------


def _wanted(record: MessageRecord, topic: str, key: str) -> bool:
    """queryMessage's check of a hit, as reads.query_messages made it in Python."""
    return record.topic == topic and (record.uniq_key == key or key in record.key_list)


def _assert_keyed_as_python(buf: Any, pos: int, limit: int | None, topic: str, key: str, check_crc: bool) -> bool:
    assert native is not None
    expected = native.decode_message(buf, pos, limit, MAX_SIZE, MessageRecord, codec.host_from_bytes, check_crc)
    out: list[MessageRecord] = []
    got = native.decode_keyed(buf, pos, limit, MAX_SIZE, MessageRecord, codec.host_from_bytes, check_crc, topic, key, out)
    assert got == expected
    wanted = expected is not None and _wanted(expected, topic, key)
    assert out == ([got] if wanted else [])
    return wanted


def _keys_to_try(record: MessageRecord) -> list[str]:
    keys = [record.uniq_key or "", "", " ", "nope", *record.key_list]
    keys += [k[:-1] for k in record.key_list if k] + [k + " " for k in record.key_list]
    if record.keys:
        keys.append(record.keys)  # the whole KEYS value: a key only if it has one token
    return keys


@pytest.mark.parametrize("path", SAMPLES, ids=["sample-a", "sample-b"])
def test_a_brokers_records_are_matched_as_python_matches_them(path: Path) -> None:
    data = path.read_bytes()
    starts = [pos for pos in range(len(data)) if codec.read_record(data, pos).kind is codec.RecordKind.MESSAGE]
    matched = 0
    for pos in starts:
        record = codec.read_message(data, pos)
        assert record is not None
        for topic in (record.topic, record.topic + "x", ""):
            for key in _keys_to_try(record):
                matched += _assert_keyed_as_python(data, pos, None, topic, key, check_crc=True)
    assert matched > len(starts)  # each record found by its own keys


@pytest.mark.parametrize(
    "props",
    [
        b"",
        b"KEYS\x01a b  c \x02",
        b"KEYS\x01 a\x02UNIQ_KEY\x01U\x02",
        b"UNIQ_KEY\x01\x02KEYS\x01\x02",
        b"KEYS\x01x\x02KEYS\x01y z\x02",  # a duplicate name: the later value, as the dict has it
        "KEYS\x01ключ \U0001f600\x02UNIQ_KEY\x01ü\x02".encode(),
        b"KEYS\x01\xff\xfe a\x02",  # not UTF-8: decoded with replacement characters
        b"TAGS\x01a\x02",
    ],
)
def test_generated_records_are_matched_as_python_matches_them(props: bytes) -> None:
    data = _raw_record(topic="Tö".encode(), props=props)
    keys = ["", " ", "a", "b", "c", "U", "x", "y", "z", "y z", "ключ", "\U0001f600", "ü", "\ufffd\ufffd", "a b  c "]
    for topic in ("Tö", "T", "Tö "):
        for key in keys:
            _assert_keyed_as_python(data, 0, None, topic, key, check_crc=False)


@pytest.mark.parametrize("seed", range(2))
def test_damaged_copies_are_decoded_and_matched_as_python_or_declined(seed: int) -> None:
    rng = random.Random(seed)
    clean, starts = _clean_log(rng)
    for _ in range(600):
        damaged, limit = _damage(rng, clean, starts)
        for start in starts:
            key = rng.choice(["ABC", "k3", "k", "", f"k{starts.index(start)}"])
            topic = rng.choice(["T", "TopicA", "Topic中"])
            _assert_keyed_as_python(damaged, start, limit, topic, key, check_crc=rng.random() < 0.5)


def test_decode_keyed_refuses_wrong_arguments() -> None:
    assert native is not None
    data = _raw_record(props=b"KEYS\x01a\x02")
    base = (data, 0, None, MAX_SIZE, MessageRecord, codec.host_from_bytes, False)
    with pytest.raises(TypeError):
        native.decode_keyed(*base, "T", b"a", [])
    with pytest.raises(TypeError):
        native.decode_keyed(*base, "T", "a", ())
    with pytest.raises(TypeError):
        native.decode_keyed(*base, "T", "a")
