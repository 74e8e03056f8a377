"""Review 108 F1: the cleaner deleted a ConsumeQueue file whose last unit is a filler (the
queue offset of a record quarantined, or lost with the log's tail) as soon as the log's first
segment went, because a filler points at commitlog offset 0. The live messages the file indexed
were still in the log and answered OFFSET_TOO_SMALL, before and after a reopen."""

from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

import mqstore
from mqstore import GetMessageStatus, Message
from mqstore.storage.codec import segment_file_name

SEG = 64 << 10
SETTINGS = {"mapped_file_size_commitlog_bytes": SEG, "mapped_file_size_consume_queue_bytes": 200}  # 10 units a file


def test_a_queue_file_ending_in_a_filler_stays_while_its_messages_are_in_the_log(tmp_path: Path) -> None:
    root = tmp_path / "store"
    at: dict[int, int] = {}
    with mqstore.open(root, **SETTINGS) as store:
        while store.put(Message(topic="X", body=b"x" * 500)).commitlog_offset < SEG:
            pass  # segment 0 holds another topic only
        for i in range(30):
            result = store.put(Message(topic="T", body=b"%04d" % i + b"t" * 300))
            assert result.ok and result.queue_offset == i
            at[i] = result.commitlog_offset
    # One flipped body byte in T/0's queue offset 9 (ConsumeQueue file 0's last slot), and the
    # queues rebuilt from the log: 9 is quarantined, a filler holds its offset.
    segment = root / "commitlog" / segment_file_name(at[9] - at[9] % SEG)
    with open(segment, "r+b") as f:
        f.seek(at[9] % SEG + 90)
        byte = f.read(1)
        f.seek(at[9] % SEG + 90)
        f.write(bytes([byte[0] ^ 0xFF]))
    shutil.rmtree(root / "consumequeue")
    with mqstore.open(root, **SETTINGS) as store:
        units = (root / "consumequeue" / "T" / "0" / segment_file_name(0)).read_bytes()
        assert struct.unpack_from(">qi", units, 180) == (0, 0x7FFFFFFF)
        assert [m.queue_offset for m in store.get("T", 0, 0, 32).messages] == list(range(9))
        old = time.time() - 5 * 86400
        os.utime(root / "commitlog" / segment_file_name(0), (old, old))  # only topic X's segment expires
        assert store.delete_expired_files_now() == 1
        assert store.min_offset("T", 0) == 0
        got = store.get("T", 0, 0, 32)
        assert got.status is GetMessageStatus.FOUND and [m.queue_offset for m in got.messages][:9] == list(range(9))
    with mqstore.open(root, **SETTINGS) as store:
        assert store.min_offset("T", 0) == 0
        assert [m.queue_offset for m in store.get("T", 0, 0, 9).messages] == list(range(9))
