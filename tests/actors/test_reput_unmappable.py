"""Review 90 L2/L3: a commitlog segment that is there but cannot be mapped now (the process
short of descriptors, memory or map areas). Reput logged "dispatch waits at a commitlog hole
until `mqstore recover`", sending an operator to a repair for nothing, or "commitlog data not
readable yet" at every tick (489 lines in 50 s). Now it says the segment cannot be mapped
now, once a minute with a count, and goes on by itself once it can."""

from __future__ import annotations

import errno
import logging
import sys
import time

import pytest

from mqstore import Message
from mqstore.faults import FaultPlan
from mqstore.storage.codec import segment_file_name
from mqstore.storage.fs import SimulatedFileSystem

helpers = sys.modules["mqstore_actor_test_helpers"]

BODY = b"b" * 4000


def _events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("mqstore.actors.reput")]


def test_a_segment_reput_cannot_map_now_is_no_hole_and_dispatch_goes_on_once_it_can(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="mqstore")
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    faults = FaultPlan()
    second = segment_file_name(helpers.SMALL["mapped_file_size_commitlog_bytes"])
    with helpers.open_small("/sim/store", fs=fs, faults=faults) as store:
        stored = 0
        while store.max_offset("T", 0) == stored and store.put_batch([Message(topic="T", body=BODY)]).ok:
            stored += 1
            if store.supervisor.ctx.read_view.view.readable_end > helpers.SMALL["mapped_file_size_commitlog_bytes"]:
                break  # into the second segment, dispatched
        helpers.wait_until(lambda: store.max_offset("T", 0) == stored, what="the puts dispatched")
        # Reput's next reader cannot map the second segment (the writer has its map already).
        fs.inject_fault("map", path_contains=second, err=errno.ENOMEM, count=1_000_000)
        faults.arm("reput.mid_dispatch")
        assert store.put(Message(topic="T", body=BODY)).ok  # crashes reput; its restart reads again
        stored += 1
        helpers.wait_until(lambda: any("cannot be mapped now" in e for e in _events(caplog)), what="the wait said")
        for _ in range(5):  # acknowledged; their dispatch waits
            assert store.put(Message(topic="T", body=BODY)).ok
            stored += 1
        time.sleep(0.5)  # (ticks retry meanwhile)
        log_end, dispatched = store.dispatch_progress()
        assert dispatched < log_end
        assert not any("hole" in e for e in _events(caplog)), _events(caplog)
        fs.clear_faults()
        helpers.wait_until(lambda: store.dispatch_progress()[1] == store.dispatch_progress()[0],
                           what="dispatch going on by itself")  # fmt: skip
        assert len(store.get("T", 0, 0, stored).messages) == stored
    waits = [e for e in _events(caplog) if "cannot be mapped now" in e or "not readable yet" in e]
    assert len(waits) <= 2, waits  # once (plus the close's count of the repeats), not once a tick
