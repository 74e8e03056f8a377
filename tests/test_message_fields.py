"""A message field of the wrong type is a TypeError naming the field, from every way of
putting, and nothing is stored: before, `tags=b"ab"` was stored as the tag "b'ab'" and a
non-str born_host raised AttributeError from deep in the encoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore import Message

BAD_FIELDS = [
    ("tags", 123), ("tags", b"ab"), ("tags", ["a"]),
    ("born_host", 5), ("born_host", b"10.0.0.1:9"),
    ("keys", {"k": 1}), ("keys", [b"k"]), ("keys", 7),
    ("properties", [("a", "b")]), ("properties", {"a": 1}), ("properties", {1: "a"}),
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


@pytest.mark.parametrize(
    ("args", "field"),
    [(("not callable",), "subscriber"), ((print, 5), "topic"), ((print, "t", "0"), "queue_id"), ((print, "t", -1), "queue_id")],
)
def test_a_subscription_with_a_wrong_argument_is_refused(tmp_path: Path, args: tuple[Any, ...], field: str) -> None:
    with mqstore.open(tmp_path / "s") as store:
        with pytest.raises((TypeError, ValueError), match=field):
            store.subscribe(*args)
