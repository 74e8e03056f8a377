"""`Asked`: how the store's own reads ask its actors (a told request with a Waiter for the
answer, instead of pykka's ask). It must keep pykka's ask semantics: the answer or the
handler's own exception reaches the asker, the actor carries on, and a request still queued
when its actor stops is failed rather than left hanging."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from mqstore import Message
from mqstore.actors.base import ServiceUnavailable
from mqstore.actors.consume_queue import ConsumeQueueService
from mqstore.messages import Asked, GetOffsetByTime, GetUnits, Reply, Waiter

h = sys.modules["mqstore_actor_test_helpers"]  # loaded by conftest.py


class Unknown:
    """No actor handles this."""


def test_an_asked_request_is_answered_and_a_bad_one_fails_only_its_asker(store_dir: Path) -> None:
    with h.open_small(store_dir) as store:
        assert store.put(Message(topic="T", queue_id=0, body=b"x")).ok
        h.wait_dispatched(store)
        units = store._ask("consume_queue", GetUnits(topic="T", queue_id=0, offset=0, max_units=8))
        assert (units.min_offset, units.max_offset) == (0, 1)
        with pytest.raises(AssertionError, match="cannot handle"):
            store._ask("consume_queue", Unknown())
        # The actor carried on: no restart, and the next request is answered.
        assert store.supervisor.restarts == []
        assert store.get("T", 0, 0, 8).messages[0].body == b"x"


def test_a_request_queued_when_its_actor_crashes_fails_its_asker(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with h.open_small(store_dir) as store:
        ref = store.supervisor.ctx.peers["consume_queue"]
        release = threading.Event()
        blocked = threading.Event()

        def block(_self: Any, _request: Any) -> int:  # keeps the actor busy while more is queued behind
            blocked.set()
            release.wait(10)
            return 0

        monkeypatch.setattr(ConsumeQueueService, "_offset_by_time", block)
        queued = Waiter()
        ref.tell(Asked(GetOffsetByTime(topic="T", queue_id=0, timestamp_ms=0), Reply(future=Waiter())))
        assert blocked.wait(10)
        ref.tell(Unknown())  # told, not asked: a broken invariant, the actor crashes
        ref.tell(Asked(GetUnits(topic="T", queue_id=0, offset=0, max_units=1), Reply(future=queued)))
        release.set()
        with pytest.raises(ServiceUnavailable, match="stopped before handling"):
            queued.get(timeout=10)
        h.wait_until(lambda: len(store.supervisor.restarts) == 1, what="the ConsumeQueue actor restarted")
        assert store.get("T", 0, 0, 1).status.name == "NO_MESSAGE_IN_QUEUE"
