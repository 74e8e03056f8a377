"""Review 61 M3: RocketMQ 5.x's confirmPhyOffset (checkpoint bytes 32..40) follows what mqstore
flushed once it is non-zero, so a 5.x broker in controller or duplication mode reopening the
directory serves, and does not truncate, what mqstore acknowledged. masterFlushedOffset (24..32)
is kept; a 4.x checkpoint (both zero) gets no byte there.

Before: both fields were kept as the 5.x broker left them, below mqstore's puts."""

from __future__ import annotations

import struct
from pathlib import Path

import mqstore
from mqstore.storage.checkpoint import CHECKPOINT_FILE_SIZE, StoreCheckpoint, read_checkpoint
from mqstore.storage.fs import RealFileSystem, SimulatedFileSystem

SETTINGS = dict(
    mapped_file_size_commitlog_bytes=64 * 1024,
    mapped_file_size_consume_queue_bytes=20 * 200,
    max_hash_slot_num=64,
    max_index_num=400,
)
_5X = struct.Struct(">qq")  # masterFlushedOffset, confirmPhyOffset at 24


def _puts(root: Path, n: int, first: int = 0) -> int:
    """The log's end after n puts (and a clean close)."""
    end = 0
    with mqstore.open(str(root), **SETTINGS) as store:
        for i in range(first, first + n):
            r = store.put(mqstore.Message(topic="T", body=b"m%d" % i))
            assert r.ok
            end = r.commitlog_offset + r.wrote_bytes
    return end


def _set_5x_fields(cp: Path, master: int, confirm: int) -> None:
    data = bytearray(cp.read_bytes())
    _5X.pack_into(data, 24, master, confirm)
    cp.write_bytes(bytes(data))


def test_puts_after_a_5x_broker_move_its_confirm_offset_to_the_flushed_end(tmp_path: Path) -> None:
    root = tmp_path / "store"
    end_5x = _puts(root, 3)
    cp = root / "checkpoint"
    _set_5x_fields(cp, end_5x, end_5x)  # what a 5.x controller-mode broker leaves
    end = _puts(root, 2, first=3)
    assert end > end_5x
    master, confirm = _5X.unpack_from(cp.read_bytes(), 24)
    assert confirm == end, "a 5.x broker in controller/duplication mode would hide the puts past it"
    assert master == end_5x  # a slave's copy of its master's: not mqstore's to change
    values = read_checkpoint(RealFileSystem(), str(cp))
    assert values.confirm_phy_offset == end and values.master_flushed_offset == end_5x
    with mqstore.open(str(root), **SETTINGS) as store:  # and it still opens, everything served
        assert [m.body for m in store.get("T", 0, 0, 8).messages] == [b"m%d" % i for i in range(5)]


def test_a_plain_5x_confirm_offset_below_the_last_record_is_moved_too(tmp_path: Path) -> None:
    """A plain 5.x broker writes the last record's start there at its recovery (and -1 is
    Java's "none"): any non-zero value follows the flushed end."""
    root = tmp_path / "store"
    _puts(root, 3)
    cp = root / "checkpoint"
    _set_5x_fields(cp, 0, -1)
    end = _puts(root, 1, first=3)
    assert _5X.unpack_from(cp.read_bytes(), 24) == (0, end)


def test_a_4x_checkpoint_gets_no_5x_bytes(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _puts(root, 3)
    _puts(root, 2, first=3)
    data = (root / "checkpoint").read_bytes()
    assert len(data) == CHECKPOINT_FILE_SIZE and data[24:40] == bytes(16)


def test_flush_writes_the_confirm_offset_only_with_a_flushed_offset() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    fs.write_atomic("/s/checkpoint", struct.pack(">qqqqq", 1_700_000_000_000, 1_700_000_000_000, 0, 330, 330)
                    + bytes(CHECKPOINT_FILE_SIZE - 40))  # fmt: skip
    cp = StoreCheckpoint(fs, "/s/checkpoint")
    assert cp.confirm_phy_offset == 330 and cp.physic_flushed_offset is None
    cp.flush()  # nothing flushed by mqstore yet: the broker's value stays
    assert _5X.unpack_from(fs.read_bytes("/s/checkpoint"), 24) == (330, 330)
    cp.physic_msg_timestamp, cp.physic_flushed_offset = 1_700_000_000_500, 600
    cp.flush()
    assert _5X.unpack_from(fs.read_bytes("/s/checkpoint"), 24) == (330, 600)
    cp.close()
    again = StoreCheckpoint(fs, "/s/checkpoint")
    assert again.values().confirm_phy_offset == 600 and again.physic_flushed_offset == 600
    again.close()
