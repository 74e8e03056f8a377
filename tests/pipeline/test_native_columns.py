"""The C column builder (storage/_native.c decode_arrow_run) against the reference paths.

The numpy gathers and the codec stay the reference: every store here, clean or damaged, must
read the same through all three decoders, corrupt rows included, and a record the C builder
does not take must go to the reference path rather than be guessed at."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("pyspark")

from mqstore.pipeline import datasource  # noqa: E402
from mqstore.pipeline.columnar import COLUMNS, NATIVE_COLUMNS  # noqa: E402
from mqstore.pipeline.datasource import SCHEMA, RocketMQReader, plan_splits, read_split  # noqa: E402
from mqstore.pipeline.segments import discover_segments, open_segment  # noqa: E402
from mqstore.storage import speedups  # noqa: E402
from mqstore.storage.codec import HostAddress, properties_to_string  # noqa: E402

h = sys.modules["mqstore_pipeline_test_helpers"]
Written = Any

pytestmark = pytest.mark.spark

native = speedups.native
needs_native = pytest.mark.skipif(native is None, reason="the C extension is not built or MQSTORE_PURE_PYTHON=1")

DECODERS = {"native": dict(fast=True, native_columns=True), "numpy": dict(fast=True, native_columns=False),
            "exact": dict(fast=False)}  # fmt: skip


def rows(store: Path | str, columns: list[str], decoder: str, split_size: int = 100_000, **kw: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for split in plan_splits([str(store)], split_size, 4 << 20):
        for batch in read_split(split, columns, **DECODERS[decoder], **kw):
            out.extend(batch.to_pylist())
    return out


def _in_order(got: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Within a batch the reference path reports a CRC failure before the batch's messages,
    # the C path where it is met: the same rows, so compare them in commitlog order.
    return sorted(got, key=lambda r: (r.get("segment_file") or "", r.get("commitlog_offset") or 0, r.get("error") or ""))


def assert_decoders_agree(store: Path | str, columns: list[str] | None = None, **kw: Any) -> list[dict[str, Any]]:
    cols = columns or list(COLUMNS)
    got = rows(store, cols, "native", **kw)
    if "commitlog_offset" in cols:
        got = _in_order(got)
        assert got == _in_order(rows(store, cols, "numpy", **kw))
        assert got == _in_order(rows(store, cols, "exact", **kw))
    else:
        assert got == rows(store, cols, "numpy", **kw)
        assert got == rows(store, cols, "exact", **kw)
    return got


def _damaged(src: Written, dst: Path, damage: Callable[[bytearray, int], None], indices: list[int]) -> Path:
    shutil.copytree(src.store, dst)
    for idx in indices:
        offset = src.offsets[idx]
        path = dst / "commitlog" / f"{offset - offset % src.segment_size:020d}"
        data = bytearray(path.read_bytes())
        damage(data, offset % src.segment_size)
        path.write_bytes(bytes(data))
    return dst


def _flip_body_byte(data: bytearray, pos: int) -> None:
    data[pos + 88 + 3] ^= 0x55  # the CRC no longer matches


def _flip_magic(data: bytearray, pos: int) -> None:
    data[pos + 4] ^= 0xFF


def _zero_header(data: bytearray, pos: int) -> None:
    data[pos : pos + 8] = bytes(8)


def _bad_body_len(data: bytearray, pos: int) -> None:
    struct.pack_into(">i", data, pos + 84, struct.unpack_from(">i", data, pos + 84)[0] + 3)


def _bad_topic_utf8(data: bytearray, pos: int) -> None:
    body_len = struct.unpack_from(">i", data, pos + 84)[0]
    data[pos + 88 + body_len + 1] = 0xFF  # the topic's first byte: not UTF-8


def _unterminated_properties(data: bytearray, pos: int) -> None:
    size = struct.unpack_from(">i", data, pos)[0]
    data[pos + size - 1] = ord("x")  # the last property separator


def test_the_broker_samples_read_the_same_through_every_decoder() -> None:
    for store in h.BROKER_SAMPLES:
        assert len(assert_decoders_agree(store)) == 47


def test_a_varied_generated_store_reads_the_same_through_every_decoder(generated_store: Written) -> None:
    # IPv6 hosts, a delayed message, transactions, empty bodies, property-less records.
    got = assert_decoders_agree(generated_store.store)
    assert len(got) == 3000 and all(r["error"] is None for r in got)
    # Narrow schemas too (the builder makes only what is asked for).
    for cols in (["topic"], ["tags_code"], ["body", "size"], ["properties", "keys", "error"], ["segment_file"]):
        assert_decoders_agree(generated_store.store, cols)


@pytest.mark.parametrize(
    "damage",
    [_flip_body_byte, _flip_magic, _zero_header, _bad_body_len, _bad_topic_utf8, _unterminated_properties],
    ids=["crc", "magic", "zeroed-header", "body-length", "topic-utf8", "unterminated-properties"],
)
def test_damaged_records_read_the_same_through_every_decoder(
    generated_store: Written, tmp_path: Path, damage: Callable[[bytearray, int], None]
) -> None:
    store = _damaged(generated_store, tmp_path / "store", damage, [100, 1501, 2998])
    got = assert_decoders_agree(store)
    errors = [r for r in got if r["error"] is not None]
    if damage is _bad_topic_utf8:  # not damage to the reader: decoded with replacement, as the codec does
        assert not errors and sum("\ufffd" in r["topic"] for r in got) == 3
    else:
        assert {generated_store.offsets[i] for i in (100, 1501, 2998)} <= {r["commitlog_offset"] for r in errors}
    # Messages around the damage are all there: only the damaged records are missing.
    messages = {r["commitlog_offset"] for r in got if r["error"] is None}
    assert messages >= set(generated_store.offsets) - {generated_store.offsets[i] for i in (100, 1501, 2998)} - {
        generated_store.offsets[i + 1] for i in (100, 1501, 2998)  # a zeroed header may hide its successor's start
    }


@pytest.mark.parametrize(
    "odd",
    ["K\x01\x02TAGS\x01T\x02", "TAGS\x01a\x02TAGS\x01b\x02", "a\x01b\x01c\x02KEYS\x01x y\x02", "\x01v\x02",
     "TAGS\x01\u00e9\u4e2d\U0001F600\x02", "\x02\x02TAGS\x01t\x02"],
    ids=["empty-value", "repeated-name", "extra-separator", "empty-name", "non-ascii", "empty-items"],
)  # fmt: skip
def test_odd_property_strings_read_the_same_through_every_decoder(tmp_path: Path, odd: str) -> None:
    specs = h.make_specs(40)
    specs[7]["properties"] = odd
    w = h.write_commitlog(tmp_path / "store", specs)
    assert len(assert_decoders_agree(w.store)) == 40


def _plain_store(tmp: Path, n: int) -> Written:
    """Records the C builder takes, every one: V1, IPv4, plain properties."""
    born, host = HostAddress("10.0.0.7", 54321), HostAddress("192.168.1.10", -5)
    specs = [
        dict(topic=f"t{i % 3}", queue_id=i % 4, body=bytes([i % 251]) * (i % 700),
             properties=properties_to_string({"TAGS": f"Tag{i % 5}", "KEYS": f"k{i}", "UNIQ_KEY": f"{i:032X}"}),
             born_host=born, store_host=host, born_timestamp=1_700_000_000_000 + i, store_timestamp=1_700_000_000_500 + i)
        for i in range(n)
    ]  # fmt: skip
    return h.write_commitlog(tmp / "store", specs)


@needs_native
def test_the_c_builder_takes_plain_records_with_no_per_row_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _plain_store(tmp_path, 500)
    expected = rows(w.store, list(COLUMNS), "exact")

    def no_reference(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the reference decoder ran on a plain record")

    monkeypatch.setattr(datasource, "decode_batch", no_reference)
    monkeypatch.setattr(datasource, "body_crc_mismatch", no_reference)
    assert rows(w.store, list(COLUMNS), "native") == expected


@needs_native
def test_the_c_builder_stops_at_the_first_record_it_does_not_take(generated_store: Written, tmp_path: Path) -> None:
    store = _damaged(generated_store, tmp_path / "store", _flip_body_byte, [5])
    seg = discover_segments([str(store)])[0]
    buf = open_segment(seg.path)
    stop, n, raw = native.decode_arrow_run(buf, 0, seg.file_size, seg.file_size, 4 << 20, 10_000, 1 << 30, True, ["size"])
    assert (stop, n) == (generated_store.offsets[5], 5)
    positions = list(struct.unpack(f"={n}q", raw["_positions"]))
    assert positions == generated_store.offsets[:5]
    # Without the CRC check the record is taken, and the walk goes on to the segment's end
    # (the blank at the end is the reference path's to decide).
    stop, n, _ = native.decode_arrow_run(buf, 0, seg.file_size, seg.file_size, 4 << 20, 10_000, 1 << 30, False, ["size"])
    in_seg = [o for o in generated_store.offsets if o < seg.file_size]
    assert n > 5 and n <= len(in_seg)
    # Row and byte limits cut after whole records.
    stop, n, _ = native.decode_arrow_run(buf, 0, seg.file_size, seg.file_size, 4 << 20, 3, 1 << 30, True, ["size"])
    assert (stop, n) == (generated_store.offsets[3], 3)
    stop, n, _ = native.decode_arrow_run(buf, 0, seg.file_size, seg.file_size, 4 << 20, 100, 1, True, ["size"])
    assert (stop, n) == (generated_store.offsets[1], 1)


@needs_native
def test_only_the_requested_columns_are_built(generated_store: Written) -> None:
    """An unused body costs nothing: no body buffer is made unless body is asked for."""
    seg = discover_segments([str(generated_store.store)])[0]
    buf = open_segment(seg.path)
    _, n, raw = native.decode_arrow_run(buf, 0, seg.file_size, seg.file_size, 4 << 20, 10_000, 1 << 30, True, ["topic", "size"])
    assert n > 0 and set(raw) == {"_positions", "topic", "size"}
    _, _, raw = native.decode_arrow_run(buf, 0, seg.file_size, seg.file_size, 4 << 20, 10_000, 1 << 30, True, sorted(NATIVE_COLUMNS))
    assert set(raw) == {"_positions", *NATIVE_COLUMNS}


@needs_native
def test_bad_arguments_are_refused_by_name(generated_store: Written) -> None:
    seg = discover_segments([str(generated_store.store)])[0]
    buf = open_segment(seg.path)
    with pytest.raises(ValueError, match="no native column nope"):
        native.decode_arrow_run(buf, 0, 100, seg.file_size, 4 << 20, 10, 1 << 20, True, ["nope"])
    with pytest.raises(ValueError, match="start"):
        native.decode_arrow_run(buf, 50, 10, seg.file_size, 4 << 20, 10, 1 << 20, True, ["size"])
    # A range past the buffer's end is clipped to it, never read.
    _, n, _ = native.decode_arrow_run(b"\x00" * 16, 0, 1 << 20, 1 << 20, 4 << 20, 10, 1 << 20, True, ["size"])
    assert n == 0


def test_the_decoder_option_is_checked() -> None:
    with pytest.raises(ValueError, match="fast, numpy, exact"):
        RocketMQReader({"path": "/nonexistent", "decoder": "quick"}, SCHEMA)
    assert RocketMQReader({"path": "/x", "decoder": "numpy"}, SCHEMA).native_columns is False


def test_mqstore_pure_python_reads_the_same(generated_store: Written) -> None:
    code = (
        "import sys, json\n"
        "from mqstore.storage import speedups\n"
        "from mqstore.pipeline.datasource import plan_splits, read_split\n"
        "assert speedups.native is None\n"
        "n = sum(b.num_rows for s in plan_splits([sys.argv[1]], 100000, 4 << 20) for b in read_split(s, ['commitlog_offset', 'body']))\n"
        "print(n)\n"
    )
    env = dict(os.environ, MQSTORE_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code, str(generated_store.store)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == 3000


@needs_native
@pytest.mark.parametrize("damage", [None, _flip_magic, _zero_header, _bad_body_len], ids=["clean", "magic", "zeroed", "body-length"])
def test_the_planner_cuts_the_same_splits_with_and_without_the_c_walk(
    generated_store: Written, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: Callable[[bytearray, int], None] | None
) -> None:
    from mqstore.pipeline.segments import plan_segment

    store = generated_store.store if damage is None else _damaged(generated_store, tmp_path / "s", damage, [3, 1501])
    segments = discover_segments([str(store)])
    for split_size in (1, 5_000, 20_000, 1 << 20):
        fast = [plan_segment(open_segment(s.path), s, split_size) for s in segments]
        monkeypatch.setattr(speedups, "native", None)
        assert [plan_segment(open_segment(s.path), s, split_size) for s in segments] == fast
        monkeypatch.setattr(speedups, "native", native)


def _wrong_offset_field(data: bytearray, pos: int) -> None:
    struct.pack_into(">q", data, pos + 28, struct.unpack_from(">q", data, pos + 28)[0] + 4096)


def test_a_record_whose_offset_field_lies_reads_the_same_through_every_decoder(generated_store: Written, tmp_path: Path) -> None:
    """Recovery quarantines such a record; the C builder leaves it to the reference check."""
    store = _damaged(generated_store, tmp_path / "store", _wrong_offset_field, [100, 1501])
    got = assert_decoders_agree(store)
    errors = [(r["commitlog_offset"], r["error"]) for r in got if r["error"] is not None]
    assert errors == [(o, f"record says it is at commitlog offset {o + 4096}") for o in
                      (generated_store.offsets[100], generated_store.offsets[1501])]  # fmt: skip
    assert len(got) == 3000
