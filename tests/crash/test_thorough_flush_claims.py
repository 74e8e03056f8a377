"""What the checkpoint says the ConsumeQueues forced, they forced: after `store.flush()` and a
power loss, every acknowledged message is at its queue offset (review 60 H1).

The thorough flush forced at most 8 files of each queue per call, yet the checkpoint took the
logics timestamp and forced offset for all of them; crash recovery then started past the
units left unforced, and nothing dispatched them again: 700 of 1,000 acknowledged messages
gone, with max_offset still 1,000."""

from __future__ import annotations

import mqstore
from mqstore.storage.fs import SimulatedFileSystem
from mqstore.ticker import ManualTicker


class Wall:
    def __init__(self) -> None:
        self.now_ms = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now_ms


def test_after_store_flush_and_a_power_loss_every_unit_the_checkpoint_claims_is_there() -> None:
    wall, ticker = Wall(), ManualTicker()
    fs = SimulatedFileSystem(clock_ms=wall)
    settings = dict(mapped_file_size_commitlog_bytes=64 * 1024, mapped_file_size_consume_queue_bytes=20 * 10,
                    flush_disk_type="SYNC_FLUSH", message_index_enable=False)  # fmt: skip
    store = mqstore.open("/sim/store", fs=fs, clock_ms=wall, ticker=ticker, **settings)
    acked: dict[int, list[int]] = {0: [], 1: []}

    def put(queue_id: int) -> None:
        wall.now_ms += 1
        result = store.put(mqstore.Message(topic="T", queue_id=queue_id, body=b"x" * 200))
        assert result.ok, result
        acked[queue_id].append(result.queue_offset)

    try:
        for _ in range(1000):  # 100 queue files of 10 units
            put(0)
        store.flush()
        wall.now_ms += 3_600_000
        for _ in range(50):
            put(1)
        store.flush()
        crashed = fs.crash(1, tear=False)  # only forced bytes survive
    finally:
        store.close()
    with mqstore.open("/sim/store", fs=crashed, clock_ms=wall, **settings) as reopened:
        for queue_id, offsets in acked.items():
            got: list[int] = []
            offset = 0
            while offset < len(offsets):
                result = reopened.get("T", queue_id, offset, 32)
                assert result.status is mqstore.GetMessageStatus.FOUND, (queue_id, offset, result)
                got += [m.queue_offset for m in result.messages]
                offset = result.next_begin_offset
            assert got == offsets, (queue_id, len(got), len(offsets))
