"""A disk with no room for the next commitlog blocks: puts are refused with a clear status,
nothing acknowledged is lost, and puts succeed again once space is back.

Without the reservation, the writer's memcpy into a page of a sparse file whose block cannot
be allocated would fault with SIGBUS and kill the process."""

from __future__ import annotations

import errno

import mqstore
from mqstore.storage.fs import SimulatedFileSystem
from mqstore.store import MessageStore

SETTINGS = dict(
    mapped_file_size_commitlog_bytes=64 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=64,
    max_index_num=400,
)


def test_a_full_disk_refuses_puts_cleanly_and_loses_nothing() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    body = b"x" * 1000
    acked: list[str] = []
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        for i in range(10):
            assert store.put(mqstore.Message(topic="T", body=body, keys=[f"k{i}"])).ok
            acked.append(f"k{i}")
        # From now on the disk has no room: the current segment's reservation covers it whole
        # (64 KiB < the window), so the refusal comes with the next segment.
        fs.inject_fault("reserve", err=errno.ENOSPC, count=1_000_000)
        refused = None
        for i in range(10, 200):
            result = store.put(mqstore.Message(topic="T", body=body, keys=[f"k{i}"]))
            if not result.ok:
                refused = result
                break
            acked.append(f"k{i}")
        assert refused is not None, "the full disk was never noticed"
        assert refused.status is mqstore.PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "disk full" in refused.detail
        assert store.supervisor.state.name == "RUNNING"  # refused, not crashed
        # Still refused while full; accepted again once space is back (the cleaner freed some).
        assert store.put(mqstore.Message(topic="T", body=body, keys=["again"])).status is refused.status
        fs.clear_faults()
        result = store.put(mqstore.Message(topic="T", body=body, keys=["after"]))
        assert result.ok, result
        acked.append("after")
        assert all_keys(store) == acked  # every acknowledged message, in order, none of the refused ones
    fs.assert_no_sigbus()


def all_keys(store: MessageStore, topic: str = "T", queue_id: int = 0) -> list[str]:
    """Every message's first key, paging (a get returns at most 32 messages from memory).
    `get` waits for this thread's own puts to be dispatched; `max_offset` does not."""
    keys: list[str] = []
    offset = 0
    while True:
        got = store.get(topic, queue_id, offset, 1000)
        if not got.messages:
            return keys
        keys += [m.key_list[0] for m in got.messages]
        offset = got.next_begin_offset


def test_bad_puts_get_message_illegal_on_either_encoder() -> None:
    """Mixed batches and bad topics are refused whichever encoder (C or Python) saw them first."""
    fs = SimulatedFileSystem()
    fs.makedirs("/sim")
    with mqstore.open("/sim/store", fs=fs, **SETTINGS) as store:
        ok = [mqstore.Message(topic="T", body=b"a"), mqstore.Message(topic="T", body=b"b")]
        assert store.put_batch(ok).ok
        illegal = mqstore.PutMessageStatus.MESSAGE_ILLEGAL
        for bad in (
            [mqstore.Message(topic="T", body=b"a"), mqstore.Message(topic="U", body=b"b")],
            [mqstore.Message(topic="T", body=b"a"), mqstore.Message(topic="T", body=b"b", queue_id=1)],
            [mqstore.Message(topic="T", body=b"a", keys=["has space"])],
            [mqstore.Message(topic="bad topic!", body=b"a")],
            [mqstore.Message(topic="T", body=b"a", queue_id=-1)],
        ):
            try:
                result = store.put_batch(bad)
            except ValueError:
                assert bad[0].queue_id == -1  # a negative queue id is a programming error
                continue
            assert result.status is illegal, (bad, result)
        assert store.get("T", 0, 0, 10).messages[-1].body == b"b"  # nothing of the bad puts
        assert store.max_offset("T", 0) == 2
