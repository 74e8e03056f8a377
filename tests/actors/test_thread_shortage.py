"""A process that cannot start a thread for a while (review 76: a pids cgroup limit, RLIMIT_NPROC,
no memory for a stack): `threading.Thread.start` raises RuntimeError("can't start new thread").
Here it is made to fail for the store's own threads by name, deterministically."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqstore import Message

helpers = sys.modules["mqstore_actor_test_helpers"]


@pytest.fixture
def refuse_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Callable[[str], bool]]]:
    """A list of `which(name)`: a thread whose name one of them accepts cannot be started."""
    start = threading.Thread.start
    refused: list[Callable[[str], bool]] = []

    def refusing_start(self: threading.Thread) -> None:
        if any(which(self.name) for which in refused):
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", refusing_start)
    yield refused


def _store_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(("mqstore", "CommitLog", "Flush", "Reput",
                                                                            "ConsumeQueue", "Index", "Allocate",
                                                                            "Cleaner", "StoreGateway", "GatewayReader")))


def test_an_open_whose_supervisor_thread_cannot_start_stops_its_store_and_frees_it(
    store_dir: Path, refuse_threads: list[Callable[[str], bool]]
) -> None:
    """The store's actors ran on and kept its lock, and the host had no store to close: every
    later open of it in the process was StoreLockedError (review 76 M1)."""
    with helpers.open_small(store_dir) as store:
        assert store.put(Message("t", b"before")).ok
    before = _store_threads()
    refuse_threads.append(lambda name: name == "mqstore-supervisor")
    with pytest.raises(RuntimeError, match="can't start new thread"):
        helpers.open_small(store_dir)
    assert _store_threads() == before
    assert not (store_dir / "abort").exists()  # stopped cleanly: nothing to recover
    refuse_threads.clear()  # threads are back
    with helpers.open_small(store_dir) as store:
        assert store.put(Message("t", b"after")).ok
        assert [m.body for m in store.get("t", 0, 0, 8).messages] == [b"before", b"after"]
