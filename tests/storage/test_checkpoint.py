"""StoreCheckpoint against spec §11.1 and two real broker checkpoint files."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from mqstore.storage.checkpoint import CHECKPOINT_FILE_SIZE, StoreCheckpoint, read_checkpoint
from mqstore.storage.fs import RealFileSystem, SimulatedFileSystem

FIXTURES = Path("/work/shared/fixtures")
# 2018-01-01 .. 2100-01-01 in epoch ms: what a real broker's timestamps must fall into.
PLAUSIBLE_MS = range(1_514_764_800_000, 4_102_444_800_000)


@pytest.mark.parametrize("sample", ["broker-sample-b", "broker-sample-c"])
def test_real_checkpoint_fixtures_decode_to_plausible_timestamps(sample: str, tmp_path: Path) -> None:
    copy = tmp_path / "checkpoint"
    shutil.copyfile(FIXTURES / sample / "checkpoint", copy)  # never touch the fixture itself
    os.chmod(copy, 0o644)
    fs = RealFileSystem()
    values = read_checkpoint(fs, str(copy))
    message = f"{sample}: {values}"
    for ts in (values.physic_msg_timestamp, values.logics_msg_timestamp, values.index_msg_timestamp):
        assert ts == 0 or ts in PLAUSIBLE_MS, message
    assert values.physic_msg_timestamp in PLAUSIBLE_MS, message
    assert values.master_flushed_offset is None and values.confirm_phy_offset is None, message
    cp = StoreCheckpoint(fs, str(copy))
    assert cp.values() == values, message
    assert cp.get_min_timestamp() == max(0, min(values.physic_msg_timestamp, values.logics_msg_timestamp) - 3000)
    assert cp.get_min_timestamp_index() == min(cp.get_min_timestamp(), values.index_msg_timestamp)
    cp.close()


def test_fixture_values_are_the_known_ones(tmp_path: Path) -> None:
    fs = RealFileSystem()
    b = read_checkpoint(fs, str(FIXTURES / "broker-sample-b" / "checkpoint"))
    c = read_checkpoint(fs, str(FIXTURES / "broker-sample-c" / "checkpoint"))
    assert (b.physic_msg_timestamp, b.logics_msg_timestamp, b.index_msg_timestamp) == (
        0x0000016944217872, 0x0000016944217872, 0), b
    assert (c.physic_msg_timestamp, c.logics_msg_timestamp, c.index_msg_timestamp) == (
        0x00000168C1CD1100, 0x00000168C1CD1100, 0), c


def test_missing_file_starts_at_zero_and_flush_writes_three_longs() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/store")
    cp = StoreCheckpoint(fs, "/store/checkpoint")
    assert cp.values().physic_msg_timestamp == 0 and cp.get_min_timestamp() == 0
    assert fs.getsize("/store/checkpoint") == CHECKPOINT_FILE_SIZE
    cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp = 5_000, 9_000, 1_000
    assert cp.get_min_timestamp() == 2_000
    assert cp.get_min_timestamp_index() == 1_000
    cp.flush()
    after = fs.crash(seed=1)
    assert struct.unpack_from(">qqq", after.read_bytes("/store/checkpoint")) == (5_000, 9_000, 1_000)
    assert StoreCheckpoint(after, "/store/checkpoint").values().logics_msg_timestamp == 9_000


def test_unflushed_values_are_not_durable() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    cp = StoreCheckpoint(fs, "/s/checkpoint")
    cp.physic_msg_timestamp = 123
    assert read_checkpoint(fs.crash(seed=2), "/s/checkpoint").physic_msg_timestamp == 0


def test_5x_extra_longs_are_read_and_never_written() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    fs.write_atomic("/s/checkpoint", struct.pack(">qqqqq", 10_000, 20_000, 30_000, 777, 888) + bytes(4096 - 40))
    cp = StoreCheckpoint(fs, "/s/checkpoint")
    assert (cp.master_flushed_offset, cp.confirm_phy_offset) == (777, 888)
    cp.physic_msg_timestamp = 11_000
    cp.flush()
    assert struct.unpack_from(">qqqqq", fs.read_bytes("/s/checkpoint")) == (11_000, 20_000, 30_000, 777, 888)


def test_short_file_is_extended_to_4096_keeping_its_values(tmp_path: Path) -> None:
    for fs, path in ((SimulatedFileSystem(), "/s/checkpoint"), (RealFileSystem(), str(tmp_path / "checkpoint"))):
        fs.makedirs(os.path.dirname(path))
        fs.write_atomic(path, struct.pack(">qq", 4_000, 6_000))
        cp = StoreCheckpoint(fs, path)
        assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (4_000, 6_000, 0)
        assert fs.getsize(path) == CHECKPOINT_FILE_SIZE
        cp.close()


def test_flush_error_is_an_oserror_and_closed_checkpoint_refuses_flush() -> None:
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    cp = StoreCheckpoint(fs, "/s/checkpoint")
    fs.inject_fault("flush", path_contains="checkpoint")
    with pytest.raises(OSError):
        cp.flush()
    cp.close()
    with pytest.raises(OSError):
        cp.flush()


def test_the_flushed_offset_goes_with_its_timestamp_and_is_checked() -> None:
    """mqstore's own field in the file's last 24 bytes: read back only for the physic
    timestamp it was written with, and only while its check holds."""
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    cp = StoreCheckpoint(fs, "/s/checkpoint")
    cp.physic_msg_timestamp, cp.physic_flushed_offset = 1_800_000_000_000, 123_456
    cp.flush()
    cp.close()
    assert read_checkpoint(fs, "/s/checkpoint").physic_flushed_offset == 123_456
    data = bytearray(fs.read_bytes("/s/checkpoint"))
    assert data[40:-48] == bytes(len(data) - 88)  # RocketMQ's longs and 5.x's slots untouched
    other = bytearray(data)
    struct.pack_into(">q", other, 0, 1_800_000_000_001)  # a broker wrote a newer timestamp after us
    fs.write_atomic("/s/checkpoint", bytes(other))
    assert read_checkpoint(fs, "/s/checkpoint").physic_flushed_offset is None
    for byte in range(len(data) - 24, len(data)):
        torn = bytearray(data)
        torn[byte] ^= 0x10
        fs.write_atomic("/s/checkpoint", bytes(torn))
        assert read_checkpoint(fs, "/s/checkpoint").physic_flushed_offset is None, byte
    fs.write_atomic("/s/checkpoint", bytes(data))
    cp = StoreCheckpoint(fs, "/s/checkpoint")
    assert cp.values().physic_flushed_offset == 123_456
    cp.close()


def test_the_queues_forced_offset_goes_with_the_logics_timestamp_and_is_checked() -> None:
    """The second field, just before the first: the commitlog offset below which every unit
    was forced, read back only for the logics timestamp it was written with."""
    fs = SimulatedFileSystem()
    fs.makedirs("/s")
    cp = StoreCheckpoint(fs, "/s/checkpoint")
    cp.physic_msg_timestamp, cp.physic_flushed_offset = 1_800_000_000_000, 123_456
    cp.logics_msg_timestamp, cp.logics_flushed_offset = 1_799_999_999_000, 100_000
    cp.flush()
    cp.close()
    values = read_checkpoint(fs, "/s/checkpoint")
    assert (values.physic_flushed_offset, values.logics_flushed_offset) == (123_456, 100_000)
    assert values.recovery_start_bound() == 100_000
    data = bytearray(fs.read_bytes("/s/checkpoint"))
    assert data[40:-48] == bytes(len(data) - 88)  # RocketMQ's longs and 5.x's slots untouched
    other = bytearray(data)
    struct.pack_into(">q", other, 8, 1_799_999_999_001)  # a broker wrote a newer logics timestamp
    fs.write_atomic("/s/checkpoint", bytes(other))
    values = read_checkpoint(fs, "/s/checkpoint")
    assert values.logics_flushed_offset is None and values.recovery_start_bound() == 123_456
    for byte in range(len(data) - 48, len(data) - 24):
        torn = bytearray(data)
        torn[byte] ^= 0x10
        fs.write_atomic("/s/checkpoint", bytes(torn))
        assert read_checkpoint(fs, "/s/checkpoint").logics_flushed_offset is None, byte
    fs.write_atomic("/s/checkpoint", bytes(data[:-48]) + bytes(48))
    assert read_checkpoint(fs, "/s/checkpoint").recovery_start_bound() is None


@pytest.mark.parametrize("sample", ["broker-sample-b", "broker-sample-c"])
def test_a_broker_checkpoint_has_no_flushed_offset(sample: str) -> None:
    assert read_checkpoint(RealFileSystem(), str(FIXTURES / sample / "checkpoint")).physic_flushed_offset is None
