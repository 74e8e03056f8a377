"""The typed protocol (issue 15): each actor takes a union of requests (refused before its
handler otherwise), `Ping` is only the start handshake (answered `Pong` by every actor), and
status queries are their own messages with one reply type each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mqstore.messages import (
    GetIndexSnapshot,
    GetQueueSnapshot,
    GetReputStatus,
    GetWriterStatus,
    IndexSnapshot,
    Ping,
    Pong,
    QueueSnapshot,
    ReputStatus,
    Tick,
    WriterReady,
)
from mqstore.runtime import ask

h = sys.modules["mqstore_actor_test_helpers"]  # loaded by conftest.py


def test_every_actor_answers_ping_with_pong_and_nothing_else(store_dir: Path) -> None:
    with h.open_small(store_dir) as store:
        peers = dict(store.supervisor.peers)
        assert {"writer", "reput", "consume_queue", "gateway"} <= set(peers)
        for name, ref in peers.items():
            assert ask(ref, Ping(), timeout_s=10) == Pong(), name


def test_status_queries_have_their_own_message_and_reply_type(store_dir: Path) -> None:
    with h.open_small(store_dir) as store:
        peers = store.supervisor.peers
        assert isinstance(ask(peers["writer"], GetWriterStatus(), timeout_s=10), WriterReady)
        assert isinstance(ask(peers["consume_queue"], GetQueueSnapshot(), timeout_s=10), QueueSnapshot)
        assert isinstance(ask(peers["index"], GetIndexSnapshot(), timeout_s=10), IndexSnapshot)
        assert isinstance(ask(peers["reput"], GetReputStatus(), timeout_s=10), ReputStatus)


def test_a_request_outside_an_actors_union_is_refused_before_its_handler(store_dir: Path) -> None:
    with h.open_small(store_dir) as store:
        with pytest.raises(AssertionError, match="writer cannot handle GetReputStatus"):
            ask(store.supervisor.peers["writer"], GetReputStatus(), timeout_s=10)
        with pytest.raises(AssertionError, match="allocator cannot handle"):
            store.supervisor.peers["allocator"].ask(Tick(now_ms=0), timeout=10)
        assert store.supervisor.restarts == []  # asked: the asker's error, the actors carry on
