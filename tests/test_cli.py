"""The `mqstore` CLI: dump of real broker directories and of ours, damaged data, plug-in groups."""

from __future__ import annotations

import base64
import json
import logging
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore import cli
from mqstore.cli import ExitCode, main
from mqstore.storage.codec import (
    HostAddress,
    blank_record_header,
    encode_cq_unit,
    encode_message,
    segment_file_name,
    tags_code,
)

FIXTURES = Path("/work/shared/fixtures")
COMMITLOG_FIELDS = [
    "topic", "queue_id", "queue_offset", "commitlog_offset", "size", "store_timestamp", "born_timestamp",
    "born_host", "store_host", "sys_flag", "flag", "reconsume_times", "tags", "keys", "properties",
    "body_base64", "msg_id", "tags_code",
]  # fmt: skip


@pytest.fixture(autouse=True)
def restore_mqstore_logger() -> Iterator[None]:
    """main() configures logging; undo it so later tests (and their caplog) see the default."""
    root = logging.getLogger("mqstore")
    saved = (list(root.handlers), root.level, root.propagate)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    root.propagate = saved[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, object]], str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, [json.loads(line) for line in captured.out.splitlines()], captured.err


@pytest.mark.parametrize("sample", ["broker-sample-a", "broker-sample-b"])
def test_dump_reads_all_47_messages_of_a_real_broker_segment(capsys: pytest.CaptureFixture[str], sample: str) -> None:
    code, rows, err = run(capsys, "dump", str(FIXTURES / sample))
    assert code == ExitCode.OK, err
    assert len(rows) == 47
    assert all(list(row) == COMMITLOG_FIELDS for row in rows)
    assert [row["queue_offset"] for row in rows] == list(range(47))
    assert [row["commitlog_offset"] for row in rows] == [172 * i for i in range(47)]
    assert {row["topic"] for row in rows} == {"abc"}


def test_dump_first_record_matches_spec_appendix_d(capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, _ = run(capsys, "dump", str(FIXTURES / "broker-sample-a"), "--what", "commitlog")
    assert code == 0
    first = rows[0]
    assert first["topic"] == "abc"
    assert first["queue_id"] == 0
    assert first["queue_offset"] == 0
    assert first["commitlog_offset"] == 0
    assert first["size"] == 172
    assert first["store_timestamp"] == 1632821159372
    assert first["born_timestamp"] == 1632821159368
    assert first["born_host"] == "127.0.0.1:0"
    assert first["store_host"] == "192.168.71.1:8123"
    assert first["msg_id"] == "C0A8470100001FBB0000000000000000"
    assert first["tags"] == "TAG1"
    assert first["tags_code"] == 2567159
    assert first["keys"] == "1632821159368"
    assert first["properties"] == {"0": "imagoodperson0", "KEYS": "1632821159368", "TAGS": "TAG1"}
    assert base64.b64decode(str(first["body_base64"])) == b"Once, there was a chance for me!"
    assert first["sys_flag"] == 0 and first["flag"] == 0 and first["reconsume_times"] == 0


def test_dump_of_a_damaged_copy_prints_the_valid_records_then_fails_naming_the_offset(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shutil.copytree(FIXTURES / "broker-sample-a", tmp_path / "store")
    segment = tmp_path / "store" / "commitlog" / "00000000000000000000"
    segment.chmod(0o644)
    data = bytearray(segment.read_bytes())
    data[344 + 4] ^= 0xFF  # the 3rd record's magic code
    segment.write_bytes(bytes(data))
    code, rows, err = run(capsys, "dump", str(tmp_path / "store"))
    assert code == ExitCode.CORRUPT == 3
    assert [row["commitlog_offset"] for row in rows] == [0, 172]
    assert "344" in err and "00000000000000000000" in err


def test_dump_detects_a_flipped_body_byte_by_its_crc(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "broker-sample-b", tmp_path / "store")
    segment = tmp_path / "store" / "commitlog" / "00000000000000000000"
    segment.chmod(0o644)
    data = bytearray(segment.read_bytes())
    data[172 * 5 + 90] ^= 0x01  # inside the 6th record's body
    segment.write_bytes(bytes(data))
    code, rows, err = run(capsys, "dump", str(tmp_path / "store"))
    assert code == 3 and len(rows) == 5
    assert "860" in err and "CRC" in err


def test_dump_stops_cleanly_at_a_record_cut_in_half(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "store" / "commitlog").mkdir(parents=True)
    data = (FIXTURES / "broker-sample-a" / "commitlog" / "00000000000000000000").read_bytes()
    (tmp_path / "store" / "commitlog" / "00000000000000000000").write_bytes(data[: 172 * 3 + 60])
    code, rows, err = run(capsys, "dump", str(tmp_path / "store"))
    assert code == 3 and len(rows) == 3
    assert "516" in err


def _our_store(root: Path, segment_size: int = 1024, messages: int = 14) -> list[bytes]:
    """A commitlog as our writer lays it out: full-size segments, blanks, a pre-allocated next file."""
    host = HostAddress.parse("127.0.0.1:10911")
    bodies = [f"message {i}".encode() * 5 for i in range(messages)]
    segments: list[bytearray] = [bytearray(segment_size)]
    pos = 0
    for i, body in enumerate(bodies):
        global_offset = (len(segments) - 1) * segment_size + pos
        record = encode_message(
            topic="orders", queue_id=1, body=body, properties=f"TAGS\x01paid\x02KEYS\x01k{i} x{i}\x02",
            born_host=HostAddress.parse("10.0.0.7:5555"), store_host=host, born_timestamp=1_700_000_000_000 + i,
            store_timestamp=1_700_000_000_100 + i, queue_offset=i, commitlog_offset=global_offset,
        )  # fmt: skip
        if len(record) + 8 > segment_size - pos:
            segments[-1][pos : pos + 8] = blank_record_header(segment_size - pos)
            segments.append(bytearray(segment_size))
            pos = 0
            record = encode_message(
                topic="orders", queue_id=1, body=body, properties=f"TAGS\x01paid\x02KEYS\x01k{i} x{i}\x02",
                born_host=HostAddress.parse("10.0.0.7:5555"), store_host=host, born_timestamp=1_700_000_000_000 + i,
                store_timestamp=1_700_000_000_100 + i, queue_offset=i,
                commitlog_offset=(len(segments) - 1) * segment_size,
            )  # fmt: skip
        segments[-1][pos : pos + len(record)] = record
        pos += len(record)
    segments.append(bytearray(segment_size))  # pre-allocated by the allocate actor, unwritten
    (root / "commitlog").mkdir(parents=True)
    for k, seg in enumerate(segments):
        (root / "commitlog" / segment_file_name(k * segment_size)).write_bytes(bytes(seg))
    return bodies


def test_dump_reads_our_own_multi_segment_commitlog(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bodies = _our_store(tmp_path)
    assert len(list((tmp_path / "commitlog").iterdir())) >= 3
    code, rows, err = run(capsys, "dump", str(tmp_path))
    assert code == 0, err
    assert [base64.b64decode(str(r["body_base64"])) for r in rows] == bodies
    assert [r["queue_offset"] for r in rows] == list(range(len(bodies)))
    assert rows[0]["keys"] == "k0 x0" and rows[0]["tags_code"] == tags_code("paid")
    offsets = [int(str(r["commitlog_offset"])) for r in rows]
    assert offsets == sorted(offsets) and 1024 in offsets and 2048 in offsets  # crossed two blanks
    assert rows[0]["store_host"] == "127.0.0.1:10911" and rows[0]["born_host"] == "10.0.0.7:5555"


def test_dump_reports_data_after_the_end_of_the_log(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _our_store(tmp_path)
    first = tmp_path / "commitlog" / segment_file_name(0)
    data = bytearray(first.read_bytes())
    blank_at = data.find(struct.pack(">i", -875286124)) - 4
    data[blank_at : blank_at + 8] = bytes(8)  # the blank is gone: the log seems to end here
    first.write_bytes(bytes(data))
    code, _, err = run(capsys, "dump", str(tmp_path))
    assert code == 3
    assert segment_file_name(1024) in err


def test_dump_consume_queue_units(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    queue = tmp_path / "consumequeue" / "orders" / "1"
    queue.mkdir(parents=True)
    units = b"".join(encode_cq_unit(172 * i, 172, 2567159) for i in range(3))
    (queue / segment_file_name(0)).write_bytes(units + bytes(60))
    (tmp_path / "consumequeue" / "other" / "0").mkdir(parents=True)
    # (both files of one size: two sizes one file each are ambiguous, refused as the open does)
    (tmp_path / "consumequeue" / "other" / "0" / segment_file_name(0)).write_bytes(encode_cq_unit(9, 10, -1) + bytes(100))
    code, rows, _ = run(capsys, "dump", str(tmp_path), "--what", "consumequeue", "--topic", "orders")
    assert code == 0
    assert rows == [
        {"topic": "orders", "queue_id": 1, "queue_offset": i, "commitlog_offset": 172 * i, "size": 172,
         "tags_code": 2567159}
        for i in range(3)
    ]  # fmt: skip
    code, rows, _ = run(capsys, "dump", str(tmp_path), "--what", "consumequeue")
    assert code == 0 and len(rows) == 4 and rows[-1]["tags_code"] == -1


def test_dump_index_header_and_entries(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    slots, entries = 8, 4
    data = bytearray(40 + slots * 4 + entries * 20)
    struct.pack_into(">qqqqii", data, 0, 1000, 2000, 0, 172, 2, 3)
    for n, (key_hash, phy, prev) in enumerate([(11, 0, 0), (12, 172, 0)], start=1):
        struct.pack_into(">iqii", data, 40 + slots * 4 + n * 20, key_hash, phy, 1, prev)
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "20210928092559372").write_bytes(bytes(data))
    code, rows, _ = run(capsys, "dump", str(tmp_path), "--what", "index", "--max-hash-slot-num", str(slots))
    assert code == 0
    assert rows[0]["kind"] == "header" and rows[0]["index_count"] == 3 and rows[0]["end_phy_offset"] == 172
    assert [(r["index"], r["key_hash"], r["commitlog_offset"]) for r in rows[1:]] == [(1, 11, 0), (2, 12, 172)]


def test_dump_checkpoint_of_a_real_broker(capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, _ = run(capsys, "dump", str(FIXTURES / "broker-sample-b"), "--what", "checkpoint")
    assert code == 0 and len(rows) == 1
    assert rows[0]["physic_msg_timestamp"] == 1551626238066
    assert rows[0]["file_size"] == 4096


def test_missing_directory_is_exit_5(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["dump", str(tmp_path / "nope")]) == ExitCode.NOT_A_STORE == 5
    assert "nope" in capsys.readouterr().err
    assert main(["dump", str(FIXTURES / "broker-sample-c")]) == 5  # no commitlog/
    assert main(["dump", str(tmp_path), "--what", "checkpoint"]) == 5


def test_usage_errors_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == ExitCode.USAGE
    assert main(["dump"]) == 2
    assert main(["no-such-command"]) == 2
    assert main(["dump", "x", "--what", "everything"]) == 2
    assert main(["--help"]) == 0
    assert "dump" in capsys.readouterr().out
    assert main(["dump", "--help"]) == 0
    assert "--what" in capsys.readouterr().out


def test_bad_configuration_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQSTORE_MAX_MESSAGE_SIZE_BYTES", "huge")
    assert main(["dump", str(FIXTURES / "broker-sample-a")]) == 2
    assert "max_message_size_bytes" in capsys.readouterr().err


def test_subcommand_groups_plug_in_and_missing_ones_are_left_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fakegroup.py").write_text(
        "def _hello(args):\n"
        "    print('hello', args.name)\n"
        "    return 0\n"
        "def add_subcommands(subparsers):\n"
        "    p = subparsers.add_parser('hello', help='say hello')\n"
        "    p.add_argument('name')\n"
        "    p.set_defaults(handler=_hello)\n"
    )
    (tmp_path / "needs_spark.py").write_text("import pyspark_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "PLUGIN_MODULES", ("no_such_module.cli", "needs_spark", "fakegroup"))
    assert main(["hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    assert main(["dump", "--help"]) == 0  # the built-ins still work


def test_log_json_flag_logs_json_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-v", "--log-json", "dump", str(FIXTURES / "broker-sample-a"), "--what", "checkpoint"]) == 5
    assert main(["-v", "--log-json", "dump", str(FIXTURES / "broker-sample-b"), "--what", "checkpoint"]) == 0
    err_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert any(json.loads(line)["event"] == "dump finished" for line in err_lines)


def test_dump_index_with_the_wrong_slot_count_is_reported_not_misread(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "20210928092559372").write_bytes(bytes(40 + 8 * 4 + 4 * 20))
    code, rows, err = run(capsys, "dump", str(tmp_path), "--what", "index", "--max-hash-slot-num", "9")
    assert code == 3 and rows == []
    assert "20210928092559372" in err


def test_an_unexpected_error_is_exit_1_with_a_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "commitlog").mkdir()

    def broken(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cli, "dump_commitlog", broken)
    assert main(["dump", str(tmp_path)]) == ExitCode.FAILURE == 1
    assert "Permission denied" in capsys.readouterr().err


def test_dump_checkpoint_shorter_than_three_longs_is_corrupt(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "checkpoint").write_bytes(bytes(16))
    code, rows, err = run(capsys, "dump", str(tmp_path), "--what", "checkpoint")
    assert code == 3 and rows == [] and "16 bytes" in err


def test_dump_reads_a_store_written_through_the_public_api(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import mqstore

    with mqstore.open(str(tmp_path)) as store:
        for i in range(5):
            assert store.put(mqstore.Message(topic="orders", body=b"hello %d" % i, keys=[f"k{i}"], tags="paid")).ok
    code, rows, err = run(capsys, "dump", str(tmp_path))
    assert code == 0, err
    assert [base64.b64decode(str(r["body_base64"])) for r in rows] == [b"hello %d" % i for i in range(5)]
    assert [r["keys"] for r in rows] == [f"k{i}" for i in range(5)]
    code, units, err = run(capsys, "dump", str(tmp_path), "--what", "consumequeue")
    assert code == 0, err
    assert [u["commitlog_offset"] for u in units] == [r["commitlog_offset"] for r in rows]
    assert {u["tags_code"] for u in units} == {tags_code("paid")}
    code, index_rows, err = run(capsys, "dump", str(tmp_path), "--what", "index")
    assert code == 0, err
    # every message is indexed (by its key, and by UNIQ_KEY if the producer side sets one)
    assert {r["commitlog_offset"] for r in index_rows if r["kind"] == "entry"} == {r["commitlog_offset"] for r in rows}
    code, checkpoint, err = run(capsys, "dump", str(tmp_path), "--what", "checkpoint")
    assert code == 0 and checkpoint[0]["physic_msg_timestamp"] >= rows[-1]["store_timestamp"]
