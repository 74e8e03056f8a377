"""Input the store must refuse (issue 19 item 8): reserved property names are MESSAGE_ILLEGAL
with a detail; bools, out-of-range ints and offsets a Java long cannot hold are TypeError or
ValueError naming the argument; nothing of a refused put or commit is kept."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mqstore
from mqstore.storage import codec
from mqstore.storage.consumer_offsets import ConsumerOffsetStore
from mqstore.storage.fs import SimulatedFileSystem

SETTINGS = dict(
    mapped_file_size_commitlog_bytes=64 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=64,
    max_index_num=400,
)
ILLEGAL = mqstore.PutMessageStatus.MESSAGE_ILLEGAL


@pytest.fixture
def store() -> mqstore.MessageStore:
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as opened:
        yield opened


def _nothing_stored(store: mqstore.MessageStore, topic: str = "T") -> None:
    assert store.max_offset(topic, 0) == 0
    assert store.query(topic, "spoofed").messages == ()


@pytest.mark.parametrize("name", sorted(codec.RESERVED_PROPERTY_NAMES))
def test_every_reserved_property_name_is_message_illegal(store: mqstore.MessageStore, name: str) -> None:
    result = store.put(mqstore.Message(topic="T", body=b"a", properties={name: "spoofed"}))
    assert result.status is ILLEGAL and name in result.detail, result
    batch = store.put_batch([mqstore.Message(topic="T", body=b"a", properties={"ok": "1", name: "spoofed"})])
    assert batch.status is ILLEGAL and name in batch.detail, batch
    _nothing_stored(store)


def test_the_reserved_list_is_rocketmq_4_4_message_const() -> None:
    for name in ("KEYS", "TAGS", "UNIQ_KEY", "WAIT", "DELAY", "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP",
                 "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "MAX_RECONSUME_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS"):  # fmt: skip
        assert name in codec.RESERVED_PROPERTY_NAMES
    # The table of spec §2.3.4 (25), and 4.9.3+/5.x's multi-dispatch names: a record carrying
    # them is refused at open as an LMQ store's (review 61), so a put may not write one.
    multi_dispatch = {"INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET"}
    assert multi_dispatch <= codec.RESERVED_PROPERTY_NAMES
    assert len(codec.RESERVED_PROPERTY_NAMES - multi_dispatch) == 25


def test_a_spoofed_uniq_key_is_not_found_by_query_and_delay_is_not_delivered(store: mqstore.MessageStore) -> None:
    assert store.put(mqstore.Message(topic="T", body=b"a", properties={"UNIQ_KEY": "spoofed"})).status is ILLEGAL
    assert store.put(mqstore.Message(topic="T", body=b"a", properties={"DELAY": "3"})).status is ILLEGAL
    # user properties with other names are stored as given
    ok = store.put(mqstore.Message(topic="T", body=b"a", properties={"color": "red"}, keys=["k"]))
    assert ok.ok
    assert store.get("T", 0, 0, 10).messages[0].properties["color"] == "red"
    assert store.query("T", "spoofed").messages == ()


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("queue_id", True, TypeError),
        ("queue_id", False, TypeError),
        ("queue_id", 1.0, TypeError),
        ("queue_id", -1, ValueError),
        ("queue_id", 2**31, ValueError),
        ("queue_id", 2**70, ValueError),
        ("flag", True, TypeError),
        ("flag", 2**31, ValueError),
        ("flag", -(2**31) - 1, ValueError),
        ("born_timestamp_ms", 2**63, ValueError),
        ("born_timestamp_ms", True, TypeError),
    ],
)
def test_bad_ints_are_programming_errors_naming_the_field(
    store: mqstore.MessageStore, field: str, value: object, error: type[Exception]
) -> None:
    bad = mqstore.Message(topic="T", body=b"a", **{field: value})  # type: ignore[arg-type]
    with pytest.raises(error, match=field):
        store.put(bad)
    with pytest.raises(error, match=field):
        store.put_batch([bad])
    # the same after a good first message (the C encoder sees the batch first)
    with pytest.raises(error, match=field):
        store.put_batch([mqstore.Message(topic="T", body=b"a"), bad])
    _nothing_stored(store)


def test_ints_at_the_java_limits_are_stored(store: mqstore.MessageStore) -> None:
    message = mqstore.Message(topic="T", body=b"a", queue_id=2**31 - 1, flag=-(2**31), born_timestamp_ms=2**63 - 1,
                              properties={"x": "y"})  # fmt: skip
    result = store.put(message)
    assert result.ok, result
    got = store.lookup(result.commitlog_offset)
    assert got is not None and (got.queue_id, got.flag, got.born_timestamp) == (2**31 - 1, -(2**31), 2**63 - 1)


@pytest.mark.parametrize(
    ("args", "error", "name"),
    [
        (("g", "T", 0, 2**63), ValueError, "offset"),
        (("g", "T", 0, 2**70), ValueError, "offset"),
        (("g", "T", 0, -5), ValueError, "offset"),
        (("g", "T", 0, True), TypeError, "offset"),
        (("g", "T", -1, 0), ValueError, "queue_id"),
        (("g", "T", True, 0), TypeError, "queue_id"),
        (("g", "T", 2**31, 0), ValueError, "queue_id"),
        (("g@x", "T", 0, 0), ValueError, "group"),
        (("", "T", 0, 0), ValueError, "group"),
        ((None, "T", 0, 0), TypeError, "group"),
        (("g", 5, 0, 0), TypeError, "topic"),
    ],
)
def test_commit_offset_refuses_what_java_cannot_read(args: tuple, error: type[Exception], name: str) -> None:  # type: ignore[type-arg]
    offsets = ConsumerOffsetStore(SimulatedFileSystem(), "/store")
    with pytest.raises(error, match=name):
        offsets.commit_offset(*args)
    assert offsets.table() == {}
    offsets.commit_offset("g", "T", 2**31 - 1, 2**63 - 1)  # the limits themselves are fine
    assert offsets.query_offset("g", "T", 2**31 - 1) == 2**63 - 1


def test_store_commit_offset_refuses_and_persists_nothing(store: mqstore.MessageStore) -> None:
    with pytest.raises(ValueError, match="offset"):
        store.commit_offset("g", "T", 0, 2**70)
    assert store.query_offset("g", "T", 0) == -1


def test_commit_offset_minus_five_is_refused_under_python_dash_o() -> None:
    code = (
        "from mqstore.storage.consumer_offsets import ConsumerOffsetStore\n"
        "from mqstore.storage.fs import SimulatedFileSystem\n"
        "s = ConsumerOffsetStore(SimulatedFileSystem(), '/s')\n"
        "try:\n    s.commit_offset('g', 'T', 0, -5)\nexcept ValueError:\n    print('refused')\n"
        "else:\n    print('stored', s.table())\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "refused", out


def test_a_bad_put_through_the_message_api_fails_its_reply_and_the_gateway_stays(store: mqstore.MessageStore) -> None:
    from mqstore.messages import Put, Reply, Waiter

    cases: list[tuple[mqstore.Message, type[Exception]]] = [
        (mqstore.Message(topic="T", body=b"a", queue_id=True), TypeError),
        (mqstore.Message(topic="T", body=b"a", flag=2**40), ValueError),
    ]
    for bad, error in cases:
        waiter = Waiter()
        store.actor_ref.tell(Put(messages=(bad,), reply=Reply(future=waiter)))
        with pytest.raises(error):
            waiter.get(timeout=10)
    waiter = Waiter()
    store.actor_ref.tell(Put(messages=(mqstore.Message(topic="T", body=b"ok"),), reply=Reply(future=waiter)))
    assert waiter.get(timeout=10).ok
