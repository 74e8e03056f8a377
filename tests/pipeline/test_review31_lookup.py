"""`lookup` never returns a corrupt record as a hit nor hides one (review 31: H5, M6, M7).

H5: an index hit whose body CRC fails (or whose physical-offset field lies) was returned as a
good hit; a corrupt record in the ranges the index path or the scan reads was dropped, so the
CLI said "not found". M6: the index path searched only topics with a consumequeue/ dir. M7: a
damaged index entry raised IndexError in the caller. All but one test run without Spark (the
index path runs in the caller's process)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

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
