"""Stores written with RocketMQ features mqstore does not implement (review 61 H1-H3, M2, L1, L2):
multi-dispatch (LMQ), ConsumeQueueExt, INNER_BATCH records / batch consume queues, DLedger logs.
Each is refused loudly by a writable open, `mqstore recover` and the commands that would misread
it, reported by `inspect`, and left byte for byte as it was. The foreign bytes are built here as
RocketMQ's sources write them (CommitLog's record layout, ConsumeQueueExt.decorate, DLedgerEntryCoder)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from pathlib import Path

import pytest

import mqstore
from mqstore import cli
from mqstore.storage import codec, scan, speedups
from mqstore.storage.foreign import ForeignStoreError

SEG = 64 * 1024
CQ_FILE = 20 * 100
T0 = 1_700_000_000_000
OPEN = dict(max_hash_slot_num=64, max_index_num=256)


@pytest.fixture(params=["native", "python"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both decoders: the C kernels and the reference Python paths must refuse alike."""
    if request.param == "python":
        monkeypatch.setattr(speedups, "native", None)
    elif speedups.native is None:
        pytest.skip("C extension not built, or MQSTORE_PURE_PYTHON=1")
    return str(request.param)


def _props(*pairs: tuple[str, str]) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in pairs)


def _record(topic: str, qoff: int, phys: int, body: bytes, props: str, sysflag: int = 0, v2: bool = False) -> bytes:
    """A V1 record with IPv4 hosts, as CommitLog.DefaultAppendMessageCallback writes it (`v2`:
    5.1+'s V2, a 2-byte topic length)."""
    tb, pb = topic.encode(), props.encode()
    rest = b"".join([
        struct.pack(">iiiqqiq", zlib.crc32(body) & 0x7FFFFFFF, 0, 0, qoff, phys, sysflag, T0),
        b"\x7f\x00\x00\x01", struct.pack(">iq", 5000, T0 + 1), b"\xc0\xa8\x01\x0a",
        struct.pack(">iiqi", 10911, 0, 0, len(body)), body, struct.pack(">h" if v2 else ">b", len(tb)), tb,
        struct.pack(">h", len(pb)), pb,
    ])  # fmt: skip
    return struct.pack(">ii", 8 + len(rest), codec.MESSAGE_MAGIC_CODE_V2 if v2 else codec.MESSAGE_MAGIC_CODE) + rest


class Log:
    """Records at their real offsets in one 64 KiB segment, and the units dispatch would write."""

    def __init__(self) -> None:
        self.data = bytearray(SEG)
        self.pos = 0
        self.units: dict[tuple[str, int], list[tuple[int, int, int]]] = {}

    def add(self, topic: str, body: bytes, *, props: str = "", tags: str = "TagA", sysflag: int = 0,
            qoff: int | None = None, unit: bool = True, v2: bool = False) -> tuple[int, int]:  # fmt: skip
        units = self.units.setdefault((topic, 0), [])
        qoff = len(units) if qoff is None else qoff
        rec = _record(topic, qoff, self.pos, body, props + _props(("TAGS", tags)), sysflag, v2)
        phys = self.pos
        self.data[phys : phys + len(rec)] = rec
        self.pos += len(rec)
        if unit:
            units.append((phys, len(rec), _jhash(tags)))
        return phys, len(rec)

    def write(self, root: Path, *, abort: bool = False, checkpoint_ms: int = T0 + 10) -> None:
        (root / "commitlog").mkdir(parents=True)
        (root / "commitlog" / ("%020d" % 0)).write_bytes(self.data)
        for (topic, qid), units in self.units.items():
            if units:
                write_cq(root / "consumequeue" / topic / str(qid), units)
        cp = bytearray(4096)
        struct.pack_into(">qqq", cp, 0, checkpoint_ms, checkpoint_ms, checkpoint_ms)
        (root / "checkpoint").write_bytes(cp)
        if abort:
            (root / "abort").write_bytes(b"")


def _jhash(s: str) -> int:
    """String.hashCode of an ASCII tag (the tags code)."""
    h = 0
    for ch in s:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def write_cq(directory: Path, units: list[tuple[int, int, int]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    data = b"".join(struct.pack(">qiq", *u) for u in units)
    (directory / ("%020d" % 0)).write_bytes(data + b"\0" * (CQ_FILE - len(data)))


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def refused_open(root: Path, match: str, **settings: object) -> None:
    """The open refuses naming `match`, and leaves every file as it was, adding no lock file (a
    refusal met in the owners' recovery may leave the index's own progress note)."""
    before = snapshot(root)
    with pytest.raises(ForeignStoreError, match=match) as refused:
        mqstore.open(root, **{**OPEN, **settings})
    assert "mqstore reads RocketMQ 4.x stores without" in str(refused.value)
    after = snapshot(root)
    assert {name: after.get(name) for name in before} == before
    assert set(after) - set(before) <= {"index_progress.msgpack"}


def lmq_log() -> tuple[Log, dict[tuple[str, int], list[tuple[int, int, int]]]]:
    log = Log()
    for i in range(3):
        log.add("TopicA", b"plain-%d" % i)
    phys, size = log.add("TopicA", b"lmq", props=_props(("INNER_MULTI_DISPATCH", "%LMQ%q1,%LMQ%q2"),
                                                        ("INNER_MULTI_QUEUE_OFFSET", "0,0")))  # fmt: skip
    log.add("TopicA", b"after")
    lmq = {(q, 0): [(phys, size, _jhash("TagA"))] for q in ("%LMQ%q1", "%LMQ%q2")}
    return log, lmq


# ---------------------------------------------------------------------------------------------
# H1: multi-dispatch (LMQ)


@pytest.mark.parametrize("abort", [False, True], ids=["clean", "crash"])
def test_lmq_queues_refused_not_deleted(tmp_path: Path, abort: bool) -> None:
    log, lmq = lmq_log()
    log.units.update(lmq)
    log.write(tmp_path, abort=abort)
    refused_open(tmp_path, r"%LMQ%q1 is a multi-dispatch \(LMQ\) queue")
    assert (tmp_path / "consumequeue" / "%LMQ%q1" / "0" / ("%020d" % 0)).exists()


def test_recover_refuses_lmq_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, lmq = lmq_log()
    log.units.update(lmq)
    log.write(tmp_path, abort=True)
    before = snapshot(tmp_path)
    assert cli.main(["recover", str(tmp_path)]) == cli.ExitCode.NOT_A_STORE
    assert "multi-dispatch (LMQ)" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("abort", [False, True], ids=["clean", "crash"])
def test_lmq_record_without_lmq_queues_refused(tmp_path: Path, abort: bool, decoder: str) -> None:
    """No %LMQ% directory (not flushed yet, or removed): the record itself, met by recovery's
    scan, refuses the open, in C and in Python alike; nothing is dispatched or cut."""
    log, _ = lmq_log()
    log.write(tmp_path, abort=abort, checkpoint_ms=0 if abort else T0 + 10)
    refused_open(tmp_path, r"record at offset \d+ \(topic 'TopicA'\) is a multi-dispatch \(LMQ\) record")


@pytest.mark.parametrize("abort", [False, True], ids=["clean", "crash"])
@pytest.mark.parametrize("props", [
    (("INNER_MULTI_DISPATCH", "%LMQ%q1"),),  # a broker with enableMultiDispatch off
    (("INNER_MULTI_QUEUE_OFFSET", "7"),),  # a producer's own property (review 64 F1)
    (("INNER_MULTI_DISPATCH", "%LMQ%q1,%LMQ%q2"), ("INNER_MULTI_QUEUE_OFFSET", "0")),  # not one offset per queue
    (("INNER_MULTI_DISPATCH", "a"), ("INNER_MULTI_QUEUE_OFFSET", "x")),
], ids=["dispatch-only", "offset-only", "counts-differ", "not-a-number"])  # fmt: skip
def test_a_record_a_broker_did_not_multi_dispatch_is_an_ordinary_message(tmp_path: Path, abort: bool,
                                                                          props: tuple[tuple[str, str], ...],
                                                                          decoder: str) -> None:  # fmt: skip
    """Only the shape a broker writes when it multi-dispatches (one queue offset per queue named)
    is refused; either name alone, or in another shape, is one ordinary message of its topic:
    a broker with enableMultiDispatch off (the default), or a producer's own properties that
    mqstore before efcece4 and RocketMQ 4.4.0 stored as any other."""
    log = Log()
    log.add("TopicA", b"plain")
    log.add("TopicA", b"asked", props=_props(*props))
    log.write(tmp_path, abort=abort, checkpoint_ms=0 if abort else T0 + 10)
    with mqstore.open(tmp_path, **OPEN) as store:
        assert [m.body for m in store.get("TopicA", 0, 0, 8).messages] == [b"plain", b"asked"]


def test_user_property_inner_multi_dispatch_refused_at_put(tmp_path: Path) -> None:
    """A put may not carry the property that makes the next open refuse the store."""
    with mqstore.open(tmp_path, **OPEN) as store:
        result = store.put(mqstore.Message(topic="T", body=b"x", properties={"INNER_MULTI_DISPATCH": "%LMQ%a"}))
        assert result.status.name == "MESSAGE_ILLEGAL" and "INNER_MULTI_DISPATCH" in result.detail


def test_own_topic_named_like_an_lmq_queue_opens(tmp_path: Path) -> None:
    """mqstore (as RocketMQ 4.4) lets a put name a topic %LMQ%...: its units point at its own records."""
    with mqstore.open(tmp_path, **OPEN) as store:
        assert store.put(mqstore.Message(topic="%LMQ%mine", body=b"x")).status.name == "PUT_OK"
    with mqstore.open(tmp_path, **OPEN) as store:
        assert [m.body for m in store.get("%LMQ%mine", 0, 0, 8).messages] == [b"x"]


# ---------------------------------------------------------------------------------------------
# H2: ConsumeQueueExt


def ext_store(root: Path, *, abort: bool, ext_dir: bool = True) -> None:
    log = Log()
    for i in range(4):
        log.add("TopicA", b"ext-%d" % i, tags="TagA" if i % 2 == 0 else "TagB")
    ext = bytearray(4096)
    units = []
    for n, (phys, size, tags) in enumerate(log.units[("TopicA", 0)]):
        ext[n * 20 : n * 20 + 20] = struct.pack(">hqqh", 20, tags, T0 + 1, 0)
        units.append((phys, size, -(1 << 63) + n * 20))  # ConsumeQueueExt.decorate
    log.units[("TopicA", 0)] = units
    log.write(root, abort=abort, checkpoint_ms=0 if abort else T0 + 10)
    if ext_dir:
        (root / "consumequeue_ext" / "TopicA" / "0").mkdir(parents=True)
        (root / "consumequeue_ext" / "TopicA" / "0" / ("%020d" % 0)).write_bytes(ext)


@pytest.mark.parametrize("abort", [False, True], ids=["clean", "crash"])
def test_consume_queue_ext_store_refused(tmp_path: Path, abort: bool, capsys: pytest.CaptureFixture[str]) -> None:
    ext_store(tmp_path, abort=abort)
    refused_open(tmp_path, "enableConsumeQueueExt")
    before = snapshot(tmp_path)
    code = cli.main(["get", str(tmp_path), "--topic", "TopicA", "--queue", "0", "--offset", "0", "--tags", "TagA"])
    assert code == cli.ExitCode.NOT_A_STORE and "consumequeue_ext" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_a_tags_code_that_reads_as_an_ext_address_is_rebuilt_after_a_crash(tmp_path: Path, decoder: str) -> None:
    """No consumequeue_ext/: a unit whose tags code reads as an ext address (its files gone, or
    one flipped top bit, review 64 F2) is cut and rebuilt from the log like any unit that does
    not match its record, and the tag filter finds what it holds."""
    ext_store(tmp_path, abort=True, ext_dir=False)
    with mqstore.open(tmp_path, **OPEN) as store:
        assert [m.body for m in store.get("TopicA", 0, 0, 8, tags="TagA").messages] == [b"ext-0", b"ext-2"]


# ---------------------------------------------------------------------------------------------
# H3: INNER_BATCH records, batch consume queues


def batch_store(root: Path, *, bcq_dir: bool) -> None:
    log = Log()
    log.add("TopicA", b"plain")
    base, bcq = 0, []
    for n in (3, 2, 4):
        inner = b"".join(struct.pack(">i", 10) + b"inner-%d!!" % k for k in range(n))
        phys, size = log.add("TopicB", inner, sysflag=0x80, qoff=base, unit=False,
                             props=_props(("INNER_NUM", str(n)), ("INNER_BASE", str(base))))  # fmt: skip
        bcq.append(struct.pack(">qiqqqhii", phys, size, _jhash("TagA"), T0 + 1, base, n, 0, 0))
        base += n
    log.write(root)
    if bcq_dir:
        d = root / "batchconsumequeue" / "TopicB" / "0"
        d.mkdir(parents=True)
        (d / ("%020d" % 0)).write_bytes(b"".join(bcq) + b"\0" * (46 * 100 - 46 * len(bcq)))


def test_batch_consume_queue_store_refused(tmp_path: Path) -> None:
    batch_store(tmp_path, bcq_dir=True)
    refused_open(tmp_path, "batchconsumequeue holds files")
    assert not (tmp_path / "consumequeue" / "TopicB").exists()


def test_inner_batch_records_never_dispatched(tmp_path: Path, decoder: str) -> None:
    """Without batchconsumequeue/: the records themselves refuse the open (the re-dispatch the
    missing queue asks for would have served each batch as one message)."""
    batch_store(tmp_path, bcq_dir=False)
    refused_open(tmp_path, r"INNER_BATCH record \(sysflag 0x80")
    assert not (tmp_path / "consumequeue" / "TopicB").exists()


def test_c_walks_leave_foreign_records_to_python() -> None:
    """The C kernels stop before a foreign record exactly where the reference does; read_dispatch refuses it."""
    if speedups.native is None:
        pytest.skip("C extension not built, or MQSTORE_PURE_PYTHON=1")
    plain = _record("T", 0, 0, b"a", _props(("TAGS", "x")))
    for foreign in (_record("T", 1, len(plain), b"b", _props(("INNER_MULTI_DISPATCH", "%LMQ%q"),
                                                             ("INNER_MULTI_QUEUE_OFFSET", "0"))),
                    _record("T", 1, len(plain), b"b", "", sysflag=0x80),
                    _record("T", 1, len(plain), b"b", "", sysflag=0x40)):  # fmt: skip
        buf = plain + foreign + plain
        kw = dict(file_from_offset=0, max_message_size=1 << 20, check_crc=True)
        assert scan.scan_run(buf, 0, len(buf), **kw) == scan.scan_run_reference(buf, 0, len(buf), **kw)
        assert scan.scan_run(buf, 0, len(buf), **kw).end == len(plain)
        decoded, pos = speedups.native.dispatch_scan(buf, 0, len(buf), 8, 1 << 20, codec.DispatchFields,
                                                     codec.SCHEDULE_TOPIC_UTF8)  # fmt: skip
        assert (len(decoded), pos) == (1, len(plain))
        with pytest.raises(ForeignStoreError):
            codec.read_dispatch(buf, len(plain), len(buf))
    # A name that only ends like it is not the property: C stops, Python reads it as a message.
    odd = _record("T", 1, len(plain), b"b", _props(("XINNER_MULTI_QUEUE_OFFSET", "v"), ("TAGS", "x")))
    kind, _size, fields = codec.read_dispatch(plain + odd, len(plain), len(plain + odd))
    assert kind is codec.RecordKind.MESSAGE and fields is not None


# ---------------------------------------------------------------------------------------------
# M2 and L1: DLedger logs; a refused open leaves no lock file of its own


def dledger_store(root: Path) -> Path:
    data = bytearray(SEG)
    pos, units = 0, []
    for i in range(4):
        rec = _record("TopicA", i, pos + 48, b"dl-%d" % i, _props(("TAGS", "TagA")))
        head = struct.pack(">iiqqqiiii", 1, 48 + len(rec), i, 1, pos, 0, 0, zlib.crc32(rec) & 0x7FFFFFFF, len(rec))
        data[pos : pos + 48 + len(rec)] = head + rec
        units.append((pos + 48, len(rec), _jhash("TagA")))
        pos += 48 + len(rec)
    d = root / "dledger-n0" / "data"
    d.mkdir(parents=True)
    (d / ("%020d" % 0)).write_bytes(data)
    write_cq(root / "consumequeue" / "TopicA" / "0", units)
    return d


def test_dledger_log_as_commitlog_refused(tmp_path: Path) -> None:
    data = dledger_store(tmp_path)
    refused_open(tmp_path, "begins with a DLedger entry header", store_path_commitlog=str(data))


def test_dledger_root_refused_without_a_lock_file_left(tmp_path: Path) -> None:
    dledger_store(tmp_path)
    refused_open(tmp_path, "DLedger mode")
    assert not (tmp_path / "lock").exists()


def test_refused_open_keeps_a_lock_file_that_was_there(tmp_path: Path) -> None:
    ext_store(tmp_path, abort=False)
    (tmp_path / "lock").write_bytes(b"")
    with pytest.raises(ForeignStoreError, match="enableConsumeQueueExt"):
        mqstore.open(tmp_path, **OPEN)
    assert (tmp_path / "lock").exists()


# ---------------------------------------------------------------------------------------------
# L2: inspect names what it does not support, and the directories it leaves alone


def test_inspect_reports_foreign_layouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch_store(tmp_path, bcq_dir=True)
    (tmp_path / "consumequeue_rocksdb").mkdir()
    (tmp_path / "consumequeue_rocksdb" / "CURRENT").write_bytes(b"MANIFEST-000005\n")
    before = snapshot(tmp_path)
    code = cli.main(["inspect", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == cli.ExitCode.NOT_A_STORE and report["verdict"] == "unsupported"
    messages = [p["message"] for p in report["problems"] if p["severity"] == "unsupported"]
    assert any("batchconsumequeue holds files" in m for m in messages), messages
    assert any("INNER_BATCH record" in m for m in messages), messages
    assert report["other_layout_directories"] == [os.path.join(str(tmp_path), "consumequeue_rocksdb")]
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# Review 61 M1: topics past 4.x's 127 bytes (5.x V2 records)

LONG_TOPIC = "L" * 200


def test_a_queue_directory_named_as_a_long_topic_refuses_the_open(tmp_path: Path) -> None:
    """Its queue was skipped by the listing (not a topic's name here) and read as empty."""
    log = Log()
    log.add("TopicA", b"short", v2=True)
    log.add(LONG_TOPIC, b"long", v2=True)
    log.write(tmp_path)
    refused_open(tmp_path, "named as a topic 200 bytes long")


@pytest.mark.parametrize("queue_dir", [False, True], ids=["record-only", "with-queue-dir"])
def test_a_long_topic_record_met_by_recovery_refuses_the_open(tmp_path: Path, queue_dir: bool, decoder: str) -> None:
    log = Log()
    log.add("TopicA", b"short")
    log.add(LONG_TOPIC, b"long", v2=True, unit=queue_dir)
    log.write(tmp_path, abort=True, checkpoint_ms=0)
    refused_open(tmp_path, "200 bytes long")


def test_short_topic_v2_records_are_read_after_a_crash(tmp_path: Path, decoder: str) -> None:
    log = Log()
    log.add("TopicA", b"v1")
    log.add("TopicA", b"v2", v2=True)
    log.write(tmp_path, abort=True, checkpoint_ms=0)
    with mqstore.open(tmp_path, **OPEN) as store:
        assert [m.body for m in store.get("TopicA", 0, 0, 8).messages] == [b"v1", b"v2"]
        assert store.put(mqstore.Message(topic="TopicA", body=b"after")).ok


def test_verify_reports_a_store_the_open_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verify said ok (exit 0) on stores whose records make the open and recover refuse (review
    64 F4); a store refused by its directories is refused by verify's own check of them."""
    batch_store(tmp_path, bcq_dir=False)
    before = snapshot(tmp_path)
    code = cli.main(["verify", str(tmp_path)])
    assert code != cli.ExitCode.OK and "unsupported_store" in capsys.readouterr().out
    assert snapshot(tmp_path) == before
    from mqstore.tools.verify import verify_store

    log, lmq = lmq_log()
    log.units.update(lmq)
    log.write(tmp_path / "lmq")
    assert "unsupported_store" in [p.kind for p in verify_store(tmp_path / "lmq").problems]
