"""`lookup` never returns a corrupt record as a hit nor hides one (review 31: H5, M6, M7).

H5: an index hit whose body CRC fails (or whose physical-offset field lies) was returned as a
good hit; a corrupt record in the ranges the index path or the scan reads was dropped, so the
CLI said "not found". M6: the index path searched only topics with a consumequeue/ dir. M7: a
damaged index entry raised IndexError in the caller. All but one test run without Spark (the
index path runs in the caller's process)."""

from __future__ import annotations

import base64
import os
import struct
import time
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("pyspark")

import mqstore  # noqa: E402
from mqstore.pipeline.columnar import arrow_schema, decode_batch  # noqa: E402
from mqstore.pipeline.lookup import lookup, lookup_by_index, main  # noqa: E402
from mqstore.pipeline.segments import discover_segments, open_segment  # noqa: E402
from mqstore.storage.codec import PHYSICAL_OFFSET_POSITION  # noqa: E402
from mqstore.storage.index import (  # noqa: E402
    DEFAULT_MAX_HASH_SLOT_NUM,
    HASH_SLOT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    build_key,
    key_hash_and_slot,
)

SEGMENT = 64 * 1024
# The default slot count (what lookup_by_index opens) with few entries: a 20 MB sparse file.
CONFIG: dict[str, Any] = dict(mapped_file_size_commitlog_bytes=SEGMENT, max_index_num=400)


def _store(path: Path, n: int = 20, topics: tuple[str, ...] = ("orders",), unindexed: int = 0) -> dict[str, int]:
    """Messages k0..k{n-1} (indexed), then k{n}.. put with the index off; key -> commitlog offset."""
    offsets: dict[str, int] = {}
    with mqstore.open(path, **CONFIG) as st:
        for i in range(n):
            r = st.put(mqstore.Message(topic=topics[i % len(topics)], body=b"good-body-%02d" % i, keys=[f"k{i}"]))
            assert r.ok
            offsets[f"k{i}"] = r.commitlog_offset
    if unindexed:
        with mqstore.open(path, message_index_enable=False, **CONFIG) as st:
            for i in range(n, n + unindexed):
                r = st.put(mqstore.Message(topic=topics[0], body=b"good-body-%02d" % i, keys=[f"k{i}"]))
                assert r.ok
                offsets[f"k{i}"] = r.commitlog_offset
    return offsets


def _segment0(store: Path) -> Path:
    return store / "commitlog" / ("%020d" % 0)


def _flip_body(store: Path, i: int) -> None:
    p = _segment0(store)
    data = bytearray(p.read_bytes())
    at = data.find(b"good-body-%02d" % i)
    assert at > 0
    data[at] ^= 0xFF
    p.write_bytes(bytes(data))


def _repoint_index_entries(store: Path, topic: str, key: str, phy: int) -> int:
    """Point every index entry of topic#key at commitlog offset `phy`; how many there were."""
    (name,) = [n for n in (store / "index").iterdir() if n.name.isdigit()]
    entries = INDEX_HEADER_SIZE + DEFAULT_MAX_HASH_SLOT_NUM * HASH_SLOT_SIZE
    target = key_hash_and_slot(build_key(topic, key), DEFAULT_MAX_HASH_SLOT_NUM)[0]
    n = 0
    with open(name, "r+b") as f:
        index_count = struct.unpack_from(">i", f.read(INDEX_HEADER_SIZE), 36)[0]
        for e in range(1, index_count):
            f.seek(entries + e * INDEX_ENTRY_SIZE)
            if struct.unpack(">i", f.read(4))[0] == target:
                f.write(struct.pack(">q", phy))
                n += 1
    return n


def _cli(store: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[int], str]:
    import json

    rc = main([str(store), *args])
    out, err = capsys.readouterr()
    return rc, [json.loads(line)["commitlog_offset"] for line in out.splitlines() if line.startswith("{")], err


# H5 ------------------------------------------------------------------------------------


def test_an_index_hit_whose_body_crc_fails_is_reported_not_returned(tmp_path: Path, capsys: Any) -> None:
    offsets = _store(tmp_path / "s")
    _flip_body(tmp_path / "s", 3)
    corrupt: list[dict[str, Any]] = []
    assert lookup_by_index([str(tmp_path / "s")], "k3", with_body=True, corrupt=corrupt) == []
    assert [(c["commitlog_offset"], c["error"]) for c in corrupt] == [(offsets["k3"], "body CRC mismatch")]
    # Before: rc 0 and the damaged body printed as a hit.
    rc, hits, err = _cli(tmp_path / "s", "--key", "k3", "--topic", "orders", "--with-body", capsys=capsys)
    assert (rc, hits) == (3, []) and f"commitlog offset {offsets['k3']}" in err and "body CRC mismatch" in err
    assert _cli(tmp_path / "s", "--key", "k3", "--strict", capsys=capsys)[:2] == (3, [])
    # Only the hits were read for another key of the topic: a good answer.
    assert _cli(tmp_path / "s", "--key", "k4", "--topic", "orders", capsys=capsys)[:2] == (0, [offsets["k4"]])


def test_an_index_hit_whose_offset_field_lies_is_reported_not_returned(tmp_path: Path) -> None:
    offsets = _store(tmp_path / "s")
    p = _segment0(tmp_path / "s")
    data = bytearray(p.read_bytes())
    struct.pack_into(">q", data, offsets["k5"] + PHYSICAL_OFFSET_POSITION, 12345)  # outside the body CRC
    p.write_bytes(bytes(data))
    corrupt: list[dict[str, Any]] = []
    assert lookup_by_index([str(tmp_path / "s")], "k5", topic="orders", corrupt=corrupt) == []
    assert [(c["commitlog_offset"], c["error"]) for c in corrupt] == [
        (offsets["k5"], "record says it is at commitlog offset 12345")
    ]


def test_a_corrupt_record_in_the_tail_the_index_does_not_cover_is_reported(tmp_path: Path, capsys: Any) -> None:
    offsets = _store(tmp_path / "s", n=10, unindexed=5)
    _flip_body(tmp_path / "s", 12)
    # Before: the scanned tail's corrupt row was dropped by the key filter: rc 1, "not found".
    rc, hits, err = _cli(tmp_path / "s", "--key", "k12", capsys=capsys)
    assert (rc, hits) == (3, []) and f"commitlog offset {offsets['k12']}" in err


def test_the_scan_reports_a_corrupt_record_rather_than_not_found(spark: Any, tmp_path: Path) -> None:
    offsets = _store(tmp_path / "s", n=8)
    _flip_body(tmp_path / "s", 3)
    corrupt: list[dict[str, Any]] = []
    assert lookup(spark, [str(tmp_path / "s")], "k3", topic="orders", with_body=True, corrupt=corrupt) == []
    assert [(c["commitlog_offset"], c["error"]) for c in corrupt] == [(offsets["k3"], "body CRC mismatch")]
    # The good records still answer; the damage met on the way is still reported.
    corrupt.clear()
    assert [h["commitlog_offset"] for h in lookup(spark, [str(tmp_path / "s")], "k4", corrupt=corrupt)] == [offsets["k4"]]
    assert [c["commitlog_offset"] for c in corrupt] == [offsets["k3"]]


# M6 ------------------------------------------------------------------------------------


def test_a_topic_without_a_consume_queue_dir_is_still_searched(tmp_path: Path, capsys: Any) -> None:
    store = tmp_path / "s"
    offsets = _store(store, topics=("orders", "gone"))
    with mqstore.open(store, **CONFIG) as st:
        assert st.clean_unused_topic(["orders"]) > 0
        assert [m.commitlog_offset for m in st.query("gone", "k1").messages] == [offsets["k1"]]
    assert not (store / "consumequeue" / "gone").exists()
    # Before: rc 1, "not found", though the record is in the log and in the index.
    assert _cli(store, "--key", "k1", capsys=capsys)[:2] == (0, [offsets["k1"]])
    assert [h["topic"] for h in lookup_by_index([str(store)], "k1") or []] == ["gone"]


# M7 ------------------------------------------------------------------------------------


def test_an_index_entry_pointing_where_no_record_fits_is_a_damaged_index(tmp_path: Path, capsys: Any) -> None:
    store = tmp_path / "s"
    _store(store)
    assert _repoint_index_entries(store, "orders", "k2", SEGMENT - 2) == 1
    corrupt: list[dict[str, Any]] = []
    # Before: IndexError from the numpy gathers, in the caller's process (CLI rc 1).
    assert lookup_by_index([str(store)], "k2", corrupt=corrupt) == []
    assert [c["commitlog_offset"] for c in corrupt] == [SEGMENT - 2]
    assert corrupt[0]["error"].startswith("damaged index")
    rc, hits, err = _cli(store, "--key", "k2", capsys=capsys)
    assert (rc, hits) == (3, []) and "damaged index" in err


def test_an_index_entry_pointing_at_another_record_is_a_damaged_index(tmp_path: Path) -> None:
    """A good record whose keys do not hash to the entry's key: the entry is wrong, and the
    record it should name is not found. Before: a silent "not found"."""
    store = tmp_path / "s"
    offsets = _store(store)
    assert _repoint_index_entries(store, "orders", "k2", offsets["k7"]) == 1
    corrupt: list[dict[str, Any]] = []
    assert lookup_by_index([str(store)], "k2", topic="orders", corrupt=corrupt) == []
    assert [c["commitlog_offset"] for c in corrupt] == [offsets["k7"]]
    assert corrupt[0]["error"].startswith("damaged index")


def test_decode_batch_gives_an_error_row_where_no_header_fits(tmp_path: Path) -> None:
    _store(tmp_path / "s", n=3)
    (seg,) = discover_segments([str(tmp_path / "s")])
    buf = open_segment(seg.path)
    schema = arrow_schema(["commitlog_offset", "size", "topic", "keys", "error"])
    for fast in (True, False):
        rows = decode_batch(buf, seg, [0, seg.file_size - 2], schema, fast=fast).to_pylist()
        assert rows[0]["error"] is None and rows[0]["keys"] == "k0"
        assert rows[1]["commitlog_offset"] == seg.file_size - 2 and rows[1]["error"]
    # A header that claims more bytes than the buffer holds: the fast path must not gather past it.
    size = struct.unpack_from(">i", buf, 0)[0]
    for cut in (size - 1, 60):
        rows = decode_batch(bytes(buf[:cut]), seg, [0], schema).to_pylist()
        assert rows[0]["error"], cut


# Review 33 -----------------------------------------------------------------------------


def _indexed(st: Any, topic: str, key: str, n: int) -> bool:
    """Whether the store's index answers n hits of topic#key (its dispatch is asynchronous)."""
    for _ in range(250):
        if len(st.query(topic, key, max_count=1000).messages) >= n:
            return True
        time.sleep(0.02)
    return False


def _after_the_index_is_opened(monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]) -> None:
    """Run `act` where lookup_by_index has opened the index files and not yet queried them
    (it lists the segments in between)."""
    from mqstore.pipeline import lookup as L

    real = L.discover_segments

    def late(*args: Any, **kwargs: Any) -> Any:
        act()
        return real(*args, **kwargs)

    monkeypatch.setattr(L, "discover_segments", late)


@pytest.mark.parametrize("topic", [None, "orders"])
def test_puts_indexed_between_the_open_and_the_query_hide_no_hit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topic: str | None
) -> None:
    """H1: the index files were mapped bounded by the entry count their header had at the
    open. Two more puts of the key moved its slot past that count, and the walk dropped the
    key's whole chain: 2 hits of 8, no error, rc 0."""
    with mqstore.open(tmp_path / "s", **CONFIG) as st:

        def put() -> int:
            r = st.put(mqstore.Message(topic="orders", body=b"hot-%d" % len(offsets), keys=["hot"]))
            assert r.ok
            return r.commitlog_offset

        offsets: list[int] = []
        for _ in range(6):
            offsets.append(put())
        assert _indexed(st, "orders", "hot", 6)

        def two_more() -> None:
            offsets.extend([put(), put()])
            assert _indexed(st, "orders", "hot", 8)

        _after_the_index_is_opened(monkeypatch, two_more)
        corrupt: list[dict[str, Any]] = []
        hits = lookup_by_index([str(tmp_path / "s")], "hot", topic=topic, corrupt=corrupt)
    assert [h["commitlog_offset"] for h in hits or []] == offsets and len(offsets) == 8
    assert corrupt == []


def test_an_entry_written_past_the_header_read_is_not_damage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """H1: the owner writes an entry, then the key's slot, then the header. An entry past the
    header as read at the open (here naming a record not in the log yet, as one being
    written, or torn) is passed over, not reported as a damaged index; the key's older
    entries are still found through it."""
    store = tmp_path / "s"
    offsets = _store(store)
    (path,) = [n for n in (store / "index").iterdir() if n.name.isdigit()]
    key_hash, slot = key_hash_and_slot(build_key("orders", "k3"), DEFAULT_MAX_HASH_SLOT_NUM)
    slot_at = INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE

    def entry_past_the_header() -> None:
        with open(path, "r+b") as f:
            index_count = struct.unpack_from(">i", f.read(INDEX_HEADER_SIZE), 36)[0]
            f.seek(slot_at)
            prev = struct.unpack(">i", f.read(4))[0]
            f.seek(INDEX_HEADER_SIZE + DEFAULT_MAX_HASH_SLOT_NUM * HASH_SLOT_SIZE + index_count * INDEX_ENTRY_SIZE)
            f.write(struct.pack(">iqii", key_hash, 5 * SEGMENT, 0, prev))
            f.seek(slot_at)
            f.write(struct.pack(">i", index_count))

    _after_the_index_is_opened(monkeypatch, entry_past_the_header)
    corrupt: list[dict[str, Any]] = []
    # Before: the walk gave up at the slot (no hit); with the file followed but the entry not
    # passed over, "damaged index: ... which no segment holds" (exit 3).
    hits = lookup_by_index([str(store)], "k3", corrupt=corrupt) or []
    assert ([h["commitlog_offset"] for h in hits], corrupt) == ([offsets["k3"]], [])


def test_a_record_over_4_mib_in_a_healthy_store_is_a_hit(tmp_path: Path) -> None:
    """M1: a broker that allows messages past 4 MiB (maxMessageSize) writes records the store
    reads back whole; lookup called them "record size ... is implausible" (exit 3 for every
    key) and withheld the hit. A record is bounded by its segment, as recovery reads it."""
    store = tmp_path / "s"
    cfg: dict[str, Any] = dict(CONFIG, mapped_file_size_commitlog_bytes=16 << 20, max_message_size_bytes=8 << 20)
    want: dict[str, int] = {}
    with mqstore.open(store, **cfg) as st:
        for key, body in (("small", b"small"), ("big", b"B" * (5 << 20))):
            want[key] = st.put(mqstore.Message(topic="orders", body=body, keys=[key])).commitlog_offset
    with mqstore.open(store, message_index_enable=False, **cfg) as st:  # in the tail the index does not cover
        want["tail"] = st.put(mqstore.Message(topic="orders", body=b"T" * (5 << 20), keys=["tail"])).commitlog_offset
    for key, offset in want.items():
        corrupt: list[dict[str, Any]] = []
        hits = lookup_by_index([str(store)], key, with_body=True, corrupt=corrupt) or []
        assert ([h["commitlog_offset"] for h in hits], corrupt) == ([offset], []), key
    assert len(base64.b64decode(hits[0]["body"])) == 5 << 20


def test_the_index_path_scans_only_what_the_index_does_not_cover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L2: the scan of what the index does not cover read every split of the log, filtering
    its rows one by one: `commitlog_until=0` (an index that starts at offset 0, as almost
    every store's does) was taken for "no upper bound"."""
    from mqstore.pipeline import lookup as L

    store = tmp_path / "s"
    with mqstore.open(store, **CONFIG) as st:
        mid = [st.put(mqstore.Message(topic="orders", body=b"x" * 2000, keys=[f"k{i}"])) for i in range(150)]
    mid_offsets = [r.commitlog_offset for r in mid]
    with mqstore.open(store, message_index_enable=False, **CONFIG) as st:
        tail = st.put(mqstore.Message(topic="orders", body=b"t", keys=["tail"])).commitlog_offset
    assert tail > 4 * SEGMENT
    scanned: list[tuple[str, int, int, Any]] = []
    real = L.read_split

    def spy(split: Any, columns: Any, **kwargs: Any) -> Any:
        if "keys" in columns:  # the scan's reads, not the topic column's
            scanned.append((os.path.basename(split.path), split.start, split.end, kwargs.get("bounds")))
        return real(split, columns, **kwargs)

    monkeypatch.setattr(L, "read_split", spy)
    for topic in (None, "orders"):
        for key, offset in (("k7", mid_offsets[7]), ("tail", tail)):
            scanned.clear()
            corrupt: list[dict[str, Any]] = []
            hits = lookup_by_index([str(store)], key, topic=topic, corrupt=corrupt) or []
            assert ([h["commitlog_offset"] for h in hits], corrupt) == ([offset], [])
            # Before: all five segments, about 5 * SEGMENT bytes walked.
            assert sum(end - start for _, start, end, _ in scanned) < SEGMENT, scanned
    # An index whose head was cleaned (it starts after the log does): the log before it is scanned.
    (path,) = [n for n in (store / "index").iterdir() if n.name.isdigit()]
    with open(path, "r+b") as f:
        f.seek(16)  # beginPhyOffset
        f.write(struct.pack(">q", mid_offsets[3]))
    scanned.clear()
    assert [h["commitlog_offset"] for h in lookup_by_index([str(store)], "k1") or []] == [mid_offsets[1]]
    assert ("%020d" % 0, 0, mid_offsets[3]) in [s[:3] for s in scanned]


def test_a_header_being_written_at_the_end_of_a_live_log_is_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H1's other half: the scan of what the index does not cover runs to the end of the log,
    where a live store's writer may be halfway through a record's header (it puts TOTALSIZE
    and MAGIC last, in that order). Damage stays; that is gone at the second read."""
    from mqstore.pipeline import lookup as L

    store = tmp_path / "s"
    offsets = _store(store, n=10, unindexed=1)
    late = offsets["k10"]
    p = _segment0(store)
    data = bytearray(p.read_bytes())
    magic = bytes(data[late + 4 : late + 8])
    data[late + 4 : late + 8] = bytes(4)  # TOTALSIZE written, MAGIC not yet
    p.write_bytes(bytes(data))
    real = L.read_split

    def writer_finishes(split: Any, columns: Any, **kwargs: Any) -> Any:
        yield from real(split, columns, **kwargs)
        if "keys" in columns:
            with open(p, "r+b") as f:
                f.seek(late + 4)
                f.write(magic)

    monkeypatch.setattr(L, "read_split", writer_finishes)
    corrupt: list[dict[str, Any]] = []
    # Before: "record size ... is implausible" (exit 3) and no hit.
    hits = lookup_by_index([str(store)], "k10", corrupt=corrupt) or []
    assert ([h["commitlog_offset"] for h in hits], corrupt) == ([late], [])
