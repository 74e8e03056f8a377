"""RocketMQ 4.4.0 store APIs and settings the port of its unit tests found missing (issue 18,
"RocketMQ parity left open"): cleanUnusedTopic, lookMessageByOffset(offset, size),
dispatchBehindBytes, defaultQueryMaxNum, the refused enableConsumeQueueExt, and the one warning
at open about settings that have no effect here."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable

import pytest

import mqstore
from mqstore import GetMessageStatus as S
from mqstore import Message, MessageStore, PutMessageStatus
from mqstore.config import ConfigError
from mqstore.faults import HoldAt
from mqstore.storage import codec
from mqstore.storage.commitlog import CommitLog, EncodedRecords
from mqstore.storage.fs import RealFileSystem

h = sys.modules["mqstore_read_test_helpers"]  # loaded by conftest.py
Open = Callable[..., MessageStore]
NO_EFFECT = "settings that have no effect in this store"


def _put(store: MessageStore, topic: str, queue_id: int = 0, body: bytes = b"x" * 100, **kw: object) -> mqstore.PutResult:
    result = store.put(Message(topic=topic, queue_id=queue_id, body=body, **kw))  # type: ignore[arg-type]
    assert result.ok, result
    return result


# lookMessageByOffset(offset, size) ---------------------------------------------------------------
def test_lookup_with_size_reads_exactly_that_record(open_store: Open) -> None:
    store = open_store()
    results = h.put_n(store, 3, body=b"abc" * 40)
    for r in results:
        found = store.lookup(r.commitlog_offset, r.wrote_bytes)
        assert found is not None and found.commitlog_offset == r.commitlog_offset
        assert found.queue_offset == r.queue_offset and found.body == b"abc" * 40
    # What a ConsumeQueue unit says about the record is exactly what the lookup takes.
    assert store.lookup(results[1].commitlog_offset, results[1].wrote_bytes) == store.lookup(results[1].commitlog_offset)


def test_lookup_with_a_size_that_disagrees_is_none_and_logged(open_store: Open, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store()
    results = h.put_n(store, 3)
    r = results[1]
    with caplog.at_level(logging.ERROR, logger="mqstore"):
        assert store.lookup(r.commitlog_offset, r.wrote_bytes - 1) is None  # the record cut short
        assert store.lookup(r.commitlog_offset, r.wrote_bytes + 1) is None  # a byte of the next one
        assert store.lookup(r.commitlog_offset, 2 * r.wrote_bytes) is None  # the next record too
    logged = [rec for rec in caplog.records if rec.getMessage() == "lookup_size_disagrees_with_record"]
    assert [rec.mqstore_event["size"] for rec in logged] == [r.wrote_bytes - 1, r.wrote_bytes + 1, 2 * r.wrote_bytes]  # type: ignore[attr-defined]
    assert all(rec.mqstore_event["record_total_size"] == r.wrote_bytes for rec in logged)  # type: ignore[attr-defined]
    # Past the readable data, or not at a record's start: nothing, never a wrong record.
    end = results[-1].commitlog_offset + results[-1].wrote_bytes
    assert store.lookup(end, r.wrote_bytes) is None
    assert store.lookup(r.commitlog_offset + 4, r.wrote_bytes) is None
    with pytest.raises(ValueError, match="size"):
        store.lookup(r.commitlog_offset, 0)
    with pytest.raises(TypeError, match="size"):
        store.lookup(r.commitlog_offset, "100")  # type: ignore[arg-type]


def test_lookup_with_size_still_checks_the_crc(open_store: Open, tmp_path: Path) -> None:
    store = open_store(check_crc_on_read=True)
    results = h.put_n(store, 3)
    bad = results[1]
    name = codec.segment_file_name(0)
    with open(tmp_path / "store" / "commitlog" / name, "r+b") as f:
        f.seek(bad.commitlog_offset + 88 + 3)  # a body byte (IPv4 hosts)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    assert store.lookup(bad.commitlog_offset, bad.wrote_bytes) is None
    assert store.stats()["corrupt_records_on_read"] == 1
    assert store.lookup(results[2].commitlog_offset, results[2].wrote_bytes) is not None


# dispatchBehindBytes ----------------------------------------------------------------------------
def test_dispatch_behind_bytes_is_what_reput_has_not_dispatched(open_store: Open) -> None:
    hold = HoldAt("reput.mid_dispatch")  # after reput published the batch's end
    store = open_store(faults=hold)
    first = h.put_n(store, 1)[0]
    # The index hears of a batch after the fault point: reput is past it for put 0.
    end0 = first.commitlog_offset + first.wrote_bytes
    assert store.read_view.await_view(lambda v: v.indexed_end >= end0, 10) is not None
    assert store.dispatch_behind_bytes() == 0
    hold.armed.set()
    try:
        _put(store, "T")
        assert hold.entered.wait(10)
        later = [_put(store, "T") for _ in range(2)]
        end = later[-1].commitlog_offset + later[-1].wrote_bytes
        assert store.read_view.await_view(lambda v: v.readable_end >= end, 10) is not None
        assert store.dispatch_behind_bytes() == end - later[0].commitlog_offset
    finally:
        hold.release.set()
    assert store.read_view.await_view(lambda v: v.dispatched_end >= end, 10) is not None
    assert store.dispatch_behind_bytes() == 0
    store.close()
    with pytest.raises(mqstore.StoreClosedError):
        store.dispatch_behind_bytes()


# cleanUnusedTopic -------------------------------------------------------------------------------
def _broker_log(root: Path, records: list[tuple[str, int, str]]) -> list[int]:
    """A commitlog as a broker leaves it without its queues (the store dispatches it at open),
    holding what a put cannot write: SCHEDULE_TOPIC_XXXX, the delayed messages' topic. Returns
    the records' offsets."""
    host = codec.HostAddress("127.0.0.1", 10911)
    fs = RealFileSystem()
    fs.makedirs(str(root / "commitlog"))
    cl = CommitLog(fs, str(root / "commitlog"), mapped_file_size=h.SMALL["mapped_file_size_commitlog_bytes"], clock_ms=lambda: h.T0)
    assert cl.load()
    offsets = []
    for topic, queue_id, properties in records:
        data = codec.encode_message(topic=topic, queue_id=queue_id, body=b"x" * 100, properties=properties,
                                    born_timestamp=h.T0, born_host=host, store_host=host)  # fmt: skip
        result = cl.put_message(EncodedRecords((data,), topic, queue_id, 0, host), h.T0)
        assert result.is_ok and result.append_result is not None
        offsets.append(result.append_result.wrote_offset)
    cl.flush(0)
    cl.close()
    return offsets


def test_clean_unused_topic_removes_the_queues_of_topics_not_kept(open_store: Open, tmp_path: Path) -> None:
    root = tmp_path / "store"
    offsets = _broker_log(root, [("A", 0, ""), ("A", 1, ""), ("A", 0, ""), ("B", 0, ""),
                                 (codec.SCHEDULE_TOPIC, 0, "DELAY\x011\x02REAL_TOPIC\x01A\x02REAL_QID\x010\x02")])  # fmt: skip
    store = open_store()
    assert store.wait_for_messages(codec.SCHEDULE_TOPIC, 0, 0, timeout_s=10)
    assert store.max_offset("A", 0) == 2 and (root / "consumequeue" / "A" / "1").is_dir()

    assert store.clean_unused_topic({"B"}) == 2  # the schedule topic always stays
    assert not (root / "consumequeue" / "A").exists()
    assert (root / "consumequeue" / "B" / "0").is_dir() and (root / "consumequeue" / codec.SCHEDULE_TOPIC / "0").is_dir()
    assert store.max_offset("A", 0) == 0 and store.max_offset("A", 1) == 0
    assert store.get("A", 0, 0).status is S.NO_MESSAGE_IN_QUEUE
    assert store.get("B", 0, 0).status is S.FOUND and store.get(codec.SCHEDULE_TOPIC, 0, 0).status is S.FOUND
    # The messages stay in the commitlog; only the queues are gone.
    kept = store.lookup(offsets[2])
    assert kept is not None and kept.topic == "A" and kept.queue_offset == 1
    # The topic-queue table forgot A: a new put starts its queue again at 0 (removeQueueFromTopicQueueTable).
    again = _put(store, "A", 0, body=b"new")
    assert again.queue_offset == 0
    assert store.wait_for_messages("A", 0, 0, timeout_s=10)
    assert [m.body for m in store.get("A", 0, 0).messages] == [b"new"]
    assert store.clean_unused_topic(["A", "B"]) == 0
    store.close()

    reopened = open_store()
    assert [m.body for m in reopened.get("A", 0, 0).messages] == [b"new"]
    assert reopened.max_offset("A", 1) == 0 and reopened.max_offset("B", 0) == 1


def test_a_cleaned_topic_holding_the_newest_records_stays_cleaned_at_a_clean_reopen(open_store: Open) -> None:
    """A difference from 4.4.0, on purpose. 4.4.0's start() sets reput at the log's end after
    either recovery, so records a stop left undispatched never get units (a clean shutdown
    waits at most 5 s for reput). RocketMQ 4.5+ (doRecheckReputOffsetFromCq) starts reput at
    the queues' highest unit instead, and so does this store: nothing stored goes missing from
    the queues. The price, in RocketMQ 4.5+, is that a topic cleaned while its records are the
    log's newest is dispatched again at the next open; here the queue ledger keeps the cleaned
    queue's floor (review 114 F1), and its records below it are not dispatched again: the next
    put to it starts the queue at 0, as it would have before the reopen."""
    store = open_store()
    _put(store, "A")
    _put(store, "B")
    assert store.wait_for_messages("B", 0, 0, timeout_s=10)
    assert store.clean_unused_topic({"A"}) == 1
    assert store.max_offset("B", 0) == 0
    assert store.close()
    reopened = open_store()
    assert reopened.max_offset("B", 0) == 0, "the cleaned queue is not dispatched again"
    put = reopened.put(Message(topic="B", body=b"new B"))
    assert put.ok and put.queue_offset == 0
    assert [m.body for m in reopened.get("B", 0, 0).messages] == [b"new B"]


def test_a_cleaned_topic_older_than_a_kept_queues_last_unit_stays_cleaned_across_a_clean_reopen(
    open_store: Open,
) -> None:
    store = open_store()
    _put(store, "B")
    _put(store, "A")
    assert store.wait_for_messages("A", 0, 0, timeout_s=10)
    assert store.clean_unused_topic({"A"}) == 1
    assert store.close()
    reopened = open_store()
    h.put_n(reopened, 1, topic="A")  # dispatch has caught up at open
    assert reopened.max_offset("B", 0) == 0


def test_clean_unused_topic_checks_its_argument(open_store: Open) -> None:
    store = open_store()
    h.put_n(store, 1)
    with pytest.raises(TypeError, match="keep"):
        store.clean_unused_topic("T")  # a str is an iterable of one-letter topics: a mistake
    with pytest.raises(TypeError, match="keep"):
        store.clean_unused_topic([b"T"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="keep"):
        store.clean_unused_topic(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keep"):
        store.clean_unused_topic([["T"]])  # type: ignore[list-item]
    assert store.max_offset("T", 0) == 1  # nothing removed by a refused call


# defaultQueryMaxNum -------------------------------------------------------------------------------
def test_query_takes_default_query_max_num_as_its_default_max(open_store: Open) -> None:
    store = open_store(default_query_max_num=2)
    for i in range(5):
        _put(store, "T", body=b"%d" % i, keys=["same"])
    assert len(store.query("T", "same").messages) == 2
    assert len(store.query("T", "same", 4).messages) == 4


# settings: refused, or named as having no effect ---------------------------------------------------
def test_enable_consume_queue_ext_is_refused_at_open(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="enable_consume_queue_ext.*not supported"):
        mqstore.open(tmp_path / "store", enable_consume_queue_ext=True)
    assert not (tmp_path / "store").exists()


def test_one_warning_at_open_names_every_no_effect_setting(open_store: Open, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="mqstore"):
        plain = open_store(tmp_path / "plain")
        h.put_n(plain, 2)
    assert not [r for r in caplog.records if r.getMessage() == NO_EFFECT]
    with caplog.at_level(logging.WARNING, logger="mqstore"):
        store = open_store(ha_listen_port=10999, use_reentrant_lock_when_put_message=True, duplication_enable=True,
                           debug_lock_enable=False, default_query_max_num=16)  # fmt: skip
        h.put_n(store, 5)
        store.close()
    warned = [r for r in caplog.records if r.getMessage() == NO_EFFECT]
    assert len(warned) == 1  # once per open, not per put
    event = warned[0].mqstore_event  # type: ignore[attr-defined]
    assert event["settings"] == ["duplication_enable", "ha_listen_port", "use_reentrant_lock_when_put_message"]
    assert "replicate" in event["why"]["ha_listen_port"] and "put lock" in event["why"]["use_reentrant_lock_when_put_message"]


# brokerRole=SLAVE ---------------------------------------------------------------------------------
def test_a_slave_store_refuses_every_put_and_reads_what_it_holds(open_store: Open) -> None:
    """4.4.0's putMessage: a SLAVE's log comes from its master (HA), so puts are refused with
    SERVICE_NOT_AVAILABLE, through every way of putting; reads go on."""
    store = open_store()
    _put(store, "T", body=b"from the master")
    store.close()
    slave = open_store(broker_role="SLAVE")
    for result in (slave.put(Message(topic="T", body=b"x")), slave.put_batch([Message(topic="T", body=b"y")]),
                   slave.put_async(Message(topic="T", body=b"z")).result(timeout=10)):  # fmt: skip
        assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "SLAVE" in result.detail
    assert [m.body for m in slave.get("T", 0, 0).messages] == [b"from the master"]
    assert slave.max_offset("T", 0) == 1
