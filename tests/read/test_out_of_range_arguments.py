"""Arguments no Java long holds, and timeouts no wait can end on, are ValueErrors from every
read: before, the C read and query loops raised OverflowError, `get` past a Java long answered
a status, and wait_for_messages(timeout_s=nan) spun until the store closed."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

import mqstore
from mqstore import Message

OUT_OF_RANGE: list[tuple[str, Callable[[mqstore.MessageStore], Any]]] = [
    ("get max_count", lambda s: s.get("t", 0, 0, 2**63)),
    ("get max_total_bytes", lambda s: s.get("t", 0, 0, max_total_bytes=2**63)),
    ("get offset", lambda s: s.get("t", 0, 2**63)),
    ("query begin_ms", lambda s: s.query("t", "k", begin_ms=2**63)),
    ("query end_ms", lambda s: s.query("t", "k", end_ms=2**64)),
    ("query max_count", lambda s: s.query("t", "k", max_count=2**63)),
    ("wait_for_messages offset", lambda s: s.wait_for_messages("t", 0, 2**63, 0)),
    ("wait_for_messages nan", lambda s: s.wait_for_messages("t", 0, 5, math.nan)),
    ("wait_for_messages negative", lambda s: s.wait_for_messages("t", 0, 5, -1.0)),
]


@pytest.mark.parametrize("call", [c[1] for c in OUT_OF_RANGE], ids=[c[0] for c in OUT_OF_RANGE])
def test_a_value_out_of_range_is_a_value_error(tmp_path: Path, call: Callable[[mqstore.MessageStore], Any]) -> None:
    with mqstore.open(tmp_path / "s") as store:
        store.put(Message("t", b"x", keys=["k"]))
        with pytest.raises(ValueError):
            call(store)


def test_the_largest_java_long_is_taken(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s") as store:
        store.put(Message("t", b"x", keys=["k"]))
        assert store.get("t", 0, 2**63 - 1, 2**63 - 1).status is mqstore.GetMessageStatus.OFFSET_OVERFLOW_BADLY
        assert [m.body for m in store.query("t", "k", max_count=2**63 - 1, end_ms=2**63 - 1).messages] == [b"x"]


def test_an_infinite_timeout_waits_until_the_message_comes(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s") as store:
        store.put(Message("t", b"x"))
        assert store.wait_for_messages("t", 0, 0, math.inf)
        arrived: list[bool] = []
        waiting = threading.Thread(target=lambda: arrived.append(store.wait_for_messages("t", 0, 1, math.inf)))
        waiting.start()
        store.put(Message("t", b"y"))
        waiting.join(30)
        assert arrived == [True]
