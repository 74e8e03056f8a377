"""A message field of the wrong type is a TypeError naming the field, from every way of
putting, and nothing is stored: before, `tags=b"ab"` was stored as the tag "b'ab'" and a
non-str born_host raised AttributeError from deep in the encoder."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, Callable

import pytest

import mqstore
from mqstore import Message
from mqstore.messages import Put, Reply, Waiter


class _Host(str):
    """A str subclass (a host's own type) for born_host."""

BAD_FIELDS = [
    ("tags", 123), ("tags", b"ab"), ("tags", ["a"]),
    ("born_host", 5), ("born_host", b"10.0.0.1:9"),
    ("keys", {"k": 1}), ("keys", [b"k"]), ("keys", 7),
    ("properties", [("a", "b")]), ("properties", {"a": 1}), ("properties", {1: "a"}),
    ("wait_store_msg_ok", "no"), ("wait_store_msg_ok", None),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS, ids=[f"{f}={v!r}" for f, v in BAD_FIELDS])
def test_a_field_of_the_wrong_type_is_a_type_error_and_stores_nothing(tmp_path: Path, field: str, value: Any) -> None:
    bad = Message("t", b"x", **{field: value})
    with mqstore.open(tmp_path / "s") as store:
        with pytest.raises(TypeError, match=field):
            store.put(bad)
        with pytest.raises(TypeError, match=field):
            store.put_async(bad)
        with pytest.raises(TypeError, match=field):
            store.put_batch([Message("t", b"ok"), bad])
        assert store.max_offset("t", 0) == 0


def test_the_types_a_message_takes_are_stored_as_given(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s") as store:
        assert store.put(Message("t", b"a", tags="T", keys="k1", born_host="10.0.0.1:9")).ok
        assert store.put(Message("t", b"b", keys=("k2", "k3"), properties={"p": "v"})).ok
        got = store.get("t", 0, 0, 2).messages
        assert [(m.tags, m.keys, m.properties.get("p")) for m in got] == [("T", "k1", None), (None, "k2 k3", "v")]
        assert str(got[0].born_host) == "10.0.0.1:9"


def test_a_born_host_port_java_cannot_read_back_is_refused(tmp_path: Path) -> None:
    """RocketMQ's MessageDecoder builds an InetSocketAddress from the record's port, which throws
    past 65535: such a record could not be read by RocketMQ's tools (review 27)."""
    with mqstore.open(tmp_path / "s") as store:
        for put in (store.put, lambda m: store.put_async(m).result(10), lambda m: store.put_batch([m])):
            with pytest.raises(ValueError, match="port 65536 out of range"):
                put(Message("t", b"x", born_host="10.0.0.1:65536"))
            for port in (70000, -5):  # a HostAddress built directly is checked as a string is (review 30)
                with pytest.raises(ValueError, match=f"port {port} out of range"):
                    put(Message("t", b"x", born_host=mqstore.HostAddress("10.0.0.1", port)))
            for odd in (80.9, "81", True):  # not quietly made an int (review 32)
                with pytest.raises(TypeError, match="port must be an int"):
                    put(Message("t", b"x", born_host=mqstore.HostAddress("10.0.0.1", odd)))  # type: ignore[arg-type]
        assert store.max_offset("t", 0) == 0
        assert store.put(Message("t", b"x", born_host="10.0.0.1:65535")).ok
        assert str(store.get("t", 0, 0, 1).messages[0].born_host) == "10.0.0.1:65535"


def test_a_memoryview_body_is_taken_by_every_way_of_putting(tmp_path: Path) -> None:
    """`put` took one and the actor protocol's Put refused it (review 27): one rule for both."""
    with mqstore.open(tmp_path / "s") as store:
        assert store.put(Message("t", memoryview(b"by put"))).ok
        waiter = Waiter()
        store.actor_ref.tell(Put(messages=(Message("t", memoryview(b"by Put")),), reply=Reply(future=waiter)))
        assert waiter.get(timeout=10).ok
        # The Put is the gateway's, not this thread's: its get does not wait for that one's
        # dispatch (the read contract follows the thread's own puts), wait_for_messages does.
        assert store.wait_for_messages("t", 0, 1, timeout_s=10)
        assert [m.body for m in store.get("t", 0, 0, 32).messages] == [b"by put", b"by Put"]


@pytest.mark.parametrize(
    ("args", "field"),
    [(("not callable",), "subscriber"), ((print, 5), "topic"), ((print, "t", "0"), "queue_id"), ((print, "t", -1), "queue_id")],
)
def test_a_subscription_with_a_wrong_argument_is_refused(tmp_path: Path, args: tuple[Any, ...], field: str) -> None:
    with mqstore.open(tmp_path / "s") as store:
        with pytest.raises((TypeError, ValueError), match=field):
            store.subscribe(*args)


class Topic(str, enum.Enum):
    ORDERS = "orders"


class Tag(str, enum.Enum):
    PAID = "paid"


STR_SUBCLASS_FIELDS = [("topic", Topic.ORDERS), ("tags", Tag.PAID), ("keys", Tag.PAID), ("keys", [Tag.PAID]),
                       ("properties", {"p": Tag.PAID}), ("properties", {Tag.PAID: "v"}), ("born_host", _Host("10.0.0.1:9"))]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), STR_SUBCLASS_FIELDS, ids=[f"{f}={v!r}" for f, v in STR_SUBCLASS_FIELDS])
def test_a_str_subclass_in_a_text_field_is_a_type_error_from_every_way_of_putting(
    tmp_path: Path, field: str, value: Any
) -> None:
    """Review 27: `class Topic(str, Enum)` is a common idiom, and the store took its members.
    The records said topic `orders`, but the writer keyed its queue table by the member's text,
    "Topic.ORDERS": the same queue got a second offset counter from 0, and PUT_OK messages were
    written at offsets already taken, out of reach of their queue for good. A tag was stored as
    its name. Every text field is an exact str now; nothing is stored, and the queue's offsets
    go on from where they were."""
    with mqstore.open(tmp_path / "s") as store:
        assert store.put(Message("orders", b"first")).queue_offset == 0
        bad = Message("orders", b"bad")._replace(**{field: value})
        attempts: list[Callable[[], Any]] = [
            lambda: store.put(bad),
            lambda: store.put_async(bad).result(10),
            lambda: store.put_batch([bad]),
            lambda: store.put_batch([Message("orders", b"ok"), bad]),
            lambda: store.put_batch_async([bad]).result(10),
        ]
        for attempt in attempts:
            with pytest.raises(TypeError, match=f"{field}.* must be .*Enum member"):
                attempt()
        waiter = Waiter()
        store.actor_ref.tell(Put(messages=(bad,), reply=Reply(future=waiter)))
        with pytest.raises(TypeError, match="Enum member"):
            waiter.get(timeout=10)
        assert store.put(Message("orders", b"second")).queue_offset == 1
        assert [m.body for m in store.get("orders", 0, 0, 32).messages] == [b"first", b"second"]


def test_a_str_subclass_topic_is_refused_by_every_read_and_queue_operation(tmp_path: Path) -> None:
    """A read by a member looked its queue up by the member's hash (its name's), and
    `clean_unused_topic(keep=[Topic.ORDERS])` would not have found `orders` among the names to
    keep: it would have removed the queue the caller asked to keep."""
    with mqstore.open(tmp_path / "s") as store:
        assert store.put(Message("orders", b"kept", keys=["k"])).ok
        for call in (
            lambda: store.get(Topic.ORDERS, 0, 0),
            lambda: store.max_offset(Topic.ORDERS, 0),
            lambda: store.wait_for_messages(Topic.ORDERS, 0, 0, 0),
            lambda: store.query(Topic.ORDERS, "k"),
            lambda: store.query("orders", Tag.PAID),
            lambda: store.subscribe(print, Topic.ORDERS),
            lambda: store.clean_unused_topic([Topic.ORDERS]),
        ):
            with pytest.raises(TypeError, match="Enum member"):
                call()
        assert [m.body for m in store.get("orders", 0, 0, 32).messages] == [b"kept"]


def test_a_property_with_an_empty_value_is_refused_not_dropped_when_read(tmp_path: Path) -> None:
    """Review 26: `properties={"x": ""}` was PUT_OK and came back without `x`: RocketMQ's
    reader (string2messageProperties) drops a pair with an empty value. Refused now, as a key
    or tag that cannot round-trip is."""
    with mqstore.open(tmp_path / "s") as store:
        bad = Message("t", b"x", properties={"kept": "v", "x": ""})
        for result in (store.put(bad), store.put_async(bad).result(10), store.put_batch([bad])):
            assert result.status is mqstore.PutMessageStatus.MESSAGE_ILLEGAL and "'x' has an empty value" in result.detail
        assert store.max_offset("t", 0) == 0
        assert store.put(Message("t", b"y", properties={"kept": "v"})).ok
        assert store.get("t", 0, 0, 1).messages[0].properties["kept"] == "v"
