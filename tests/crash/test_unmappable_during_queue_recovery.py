"""Review 92 (aside): after a crash, recovery keeps the ConsumeQueue units past the re-dispatch
start that match the records they point at, and cuts each queue at its first unit that does
not. A segment the process could not map then (short of descriptors, memory or map areas)
read as no record, so the unit "did not match" and the queue was cut on no evidence (its
units re-dispatched later, if the disk and the maps allowed). Now the open refuses with the
errno, cuts nothing, and opens whole once the process has room."""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path
from typing import Any

import pytest

import mqstore
from mqstore.storage import recovery
from mqstore.storage.commitlog import CommitLogReader

SETTINGS = {"mapped_file_size_commitlog_bytes": 64 * 1024, "mapped_file_size_consume_queue_bytes": 2000}


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("err", [errno.EMFILE, errno.ENOMEM])
def test_a_segment_recovery_cannot_map_refuses_the_open_and_cuts_no_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    store = tmp_path / "store"
    with mqstore.open(store, **SETTINGS) as s:
        for i in range(600):
            assert s.put(mqstore.Message(topic="t", queue_id=i % 2, body=b"m" * 100)).ok
    (store / "abort").touch()  # as after a crash: units past the re-dispatch start are checked
    queues = store / "consumequeue"
    before = _hashes(queues)

    class Short(CommitLogReader):
        """The unit checker's reader, in a process with no descriptor or map to spare."""

        def _map(self, path: str, start: int) -> Any:
            self._map_errors[start] = OSError(err, "short", path)
            self.map_failures += 1
            return None

    monkeypatch.setattr(recovery, "CommitLogReader", Short)
    with pytest.raises(OSError) as refused:
        mqstore.open(store, **SETTINGS)
    assert refused.value.errno == err and "nothing was cut" in str(refused.value), repr(refused.value)
    assert _hashes(queues) == before
    monkeypatch.undo()
    with mqstore.open(store, **SETTINGS) as s:
        for queue_id in (0, 1):
            got = 0
            while got < 300:
                result = s.get("t", queue_id, got, 32)
                assert result.messages, result
                got += len(result.messages)
