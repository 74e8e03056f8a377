"""The store checkpoint file `<root>/checkpoint` (spec §11.1).

A mapped 4096-byte file whose first three longs say up to which store timestamp the
CommitLog, the ConsumeQueues and the index files were durable. Recovery after a crash starts
from the commitlog file whose first message is older than `get_min_timestamp()`.
RocketMQ 5.x adds masterFlushedOffset (offset 24) and confirmPhyOffset (offset 32).
masterFlushedOffset (a slave's copy of its master's flushed offset) is kept as it is.
confirmPhyOffset, once non-zero, follows mqstore's flushed offset (review 61 M3): 5.x loads it
at every start (`setConfirmOffset(getConfirmPhyOffset())`), and in controller or duplication
mode recovery and reput serve only the records below it (and a controller-mode broker may
truncate to it); left where the 5.x broker last put it, it would hide or cut what mqstore
acknowledged. mqstore has no replicas: all it flushed is confirmed. A plain 5.x broker
overwrites the field at its recovery. Zero (4.x, or a 5.x store that never set it) stays zero,
so a 4.x file gets no new bytes there.

A file that is not a checkpoint is refused (CheckpointError, a StoreDirectoryError), never
rewritten (review 63 F2): one longer than 4096 bytes, which neither RocketMQ nor mqstore
writes, and one whose timestamps or offsets no broker writes (text reads as timestamps
millions of years ahead). A shorter one (a file cut short: RocketMQ's map() extends a new file
to 4096 bytes, so a cut is the only way to get one) is padded with zeros where its values are
plausible: a cut only lowers the big-endian longs, which moves recovery's start earlier.

mqstore's own field, in the file's last 24 bytes (no RocketMQ version reads or writes there):
the commitlog offset the physic timestamp was flushed up to, the timestamp it goes with, and
a check of the two. Crash recovery uses it to tell a power loss's torn tail (damage at or past
it: cut there) from damage to flushed bytes (before it: quarantined, and the valid records
after it kept), which the millisecond timestamp alone cannot split within its last
millisecond. It counts only while its timestamp is the file's physic timestamp and its check
holds: a broker that wrote the file after us, or a damaged field, leaves recovery with the
timestamp alone, as before.

A second such field, just before it, holds the commitlog offset below which every record's
ConsumeQueue unit was forced at the logics timestamp's thorough flush. Crash recovery starts no
later than the segments holding either offset: timestamps alone place the start only while
store times rise along the log (a clock stepped back made every later segment look older than
the checkpoint, review 57 F1).
"""

from __future__ import annotations

import errno
import struct
import time
from dataclasses import dataclass
from typing import Any, Final

from mqstore.storage.fs import FileSystem
from mqstore.storage.lockfiles import StoreDirectoryError
from mqstore.storage.mapped_file import DiskFullError

__all__ = [
    "CHECKPOINT_FILE_SIZE",
    "CheckpointError",
    "CheckpointValues",
    "StoreCheckpoint",
    "check_checkpoint_bytes",
    "create_checkpoint_file",
    "read_checkpoint",
]

CHECKPOINT_FILE_SIZE: Final = 4096
_THREE_LONGS = struct.Struct(">qqq")
_FIVE_LONGS = struct.Struct(">qqqqq")
_FLUSHED = struct.Struct(">qqq")  # (flushed offset, its physic timestamp, check)
_FLUSHED_AT: Final = CHECKPOINT_FILE_SIZE - _FLUSHED.size
_FLUSHED_CHECK: Final = 0x6D7173746F726521  # b"mqstore!": a zeroed or torn field does not pass
_LOGICS_FLUSHED_AT: Final = _FLUSHED_AT - _FLUSHED.size  # (offset, its logics timestamp, check)
_LOGICS_FLUSHED_CHECK: Final = 0x6D7173746F726571  # b"mqstoreq"


def _flushed_check(offset: int, timestamp: int, salt: int = _FLUSHED_CHECK) -> int:
    return (offset ^ timestamp ^ salt) - (1 << 63)  # a signed long, like the fields


def _unpack_flushed(data: bytes | bytearray | memoryview, at: int, timestamp: int, salt: int) -> int | None:
    offset, stamped, check = _FLUSHED.unpack_from(data, at)
    return offset if offset > 0 and stamped == timestamp and check == _flushed_check(offset, stamped, salt) else None


def _pack_flushed(buf: Any, at: int, offset: int | None, timestamp: int, salt: int) -> None:
    offset = offset or 0
    _FLUSHED.pack_into(buf, at, offset, timestamp if offset > 0 else 0,
                       _flushed_check(offset, timestamp, salt) if offset > 0 else 0)  # fmt: skip
# Recovery starts this far before the older of the commitlog/consume-queue timestamps.
_MIN_TIMESTAMP_MARGIN_MS: Final = 3000
_CONFIRM_AT: Final = 32  # 5.x confirmPhyOffset

# A timestamp is a broker's wall clock when it stored a record. Clocks are wrong, and a clock
# once read decades ahead must not leave a store that refuses to open once the clock is right
# again, so the bound is very wide: this far past the later of now and _CLOCK_FLOOR_MS (a machine
# whose clock reads 1970 until NTP sets it refuses no checkpoint written in the years around this
# code). What is not a checkpoint is far past it: a long of text is >= 0x0900... ms (20 million
# years).
_CLOCK_AHEAD_ALLOWED_MS: Final = 1000 * 366 * 86_400_000
_CLOCK_FLOOR_MS: Final = 1_735_689_600_000  # 2025-01-01T00:00:00Z
# The 5.x offsets: -1 is Java's "none" (5.0's computeConfirmOffset could return a slave's
# initial ack offset, -1), so it is a value a broker wrote; below it, nothing is.
_LOWEST_5X_OFFSET: Final = -1


class CheckpointError(StoreDirectoryError):
    """The checkpoint file is not one RocketMQ or mqstore wrote (its size or its values): the
    store does not guess where recovery may start from it, and does not rewrite it."""


def check_checkpoint_bytes(data: bytes | bytearray | memoryview, size: int, path: str,
                           now_ms: int | None = None) -> None:  # fmt: skip
    """CheckpointError, naming `path` and what is wrong, unless `data` (the file's first bytes,
    up to 4096; `size` the file's size) is a checkpoint: no longer than 4096 bytes, its three
    timestamps between 0 and a generous bound ahead of the clock, and its 5.x offsets not below
    -1 (see the module). A short file is checked as the zero-padded file it would become."""
    fix = "move it aside to open the store without a checkpoint (crash recovery then starts from the log's first segment)"
    if size > CHECKPOINT_FILE_SIZE:
        raise CheckpointError(f"{path} is {size} bytes, longer than the {CHECKPOINT_FILE_SIZE} bytes of a checkpoint "
                              f"RocketMQ or mqstore writes: not a store checkpoint, or something appended to one; "
                              f"it is left as it is; put the store's own checkpoint back, or {fix}")  # fmt: skip
    head = bytes(data[: _FIVE_LONGS.size])
    head += bytes(_FIVE_LONGS.size - len(head))
    longs = _FIVE_LONGS.unpack(head)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    latest = max(now, _CLOCK_FLOOR_MS) + _CLOCK_AHEAD_ALLOWED_MS
    wrong = [f"{name} {value} is not a timestamp (negative)" if value < 0 else
             f"{name} {value} is not a timestamp (more than 1,000 years ahead of the clock)"
             for name, value in zip(("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp"), longs[:3])
             if not 0 <= value <= latest]  # fmt: skip
    wrong += [f"{name} {value} is not an offset (below -1)"
              for name, value in zip(("masterFlushedOffset", "confirmPhyOffset"), longs[3:]) if value < _LOWEST_5X_OFFSET]  # fmt: skip
    if wrong:
        short = f" ({size} bytes, read as if padded with zeros to {CHECKPOINT_FILE_SIZE})" if size < CHECKPOINT_FILE_SIZE else ""
        raise CheckpointError(f"{path} is not a store checkpoint{short}: " + "; ".join(wrong)
                              + f"; it is left as it is; put the store's own checkpoint back, or {fix}")  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointValues:
    physic_msg_timestamp: int
    logics_msg_timestamp: int
    index_msg_timestamp: int
    master_flushed_offset: int | None = None  # 5.x only; None when zero
    confirm_phy_offset: int | None = None  # 5.x only; None when zero
    # mqstore only (see the module): the commitlog is durable below this offset, which the
    # physic timestamp is the newest record of; None when absent or not for this timestamp.
    physic_flushed_offset: int | None = None
    # mqstore only: every ConsumeQueue unit of a record below this offset was forced at the
    # thorough flush the logics timestamp is from; None when absent or not for this timestamp.
    logics_flushed_offset: int | None = None

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> CheckpointValues:
        if len(data) < _FIVE_LONGS.size:
            data = bytes(data) + bytes(_FIVE_LONGS.size - len(data))  # a short file reads as zeros
        phy, logics, index, master_flushed, confirm = _FIVE_LONGS.unpack_from(data, 0)
        flushed = logics_flushed = None
        if len(data) >= CHECKPOINT_FILE_SIZE:
            flushed = _unpack_flushed(data, _FLUSHED_AT, phy, _FLUSHED_CHECK)
            logics_flushed = _unpack_flushed(data, _LOGICS_FLUSHED_AT, logics, _LOGICS_FLUSHED_CHECK)
        return cls(
            physic_msg_timestamp=phy,
            logics_msg_timestamp=logics,
            index_msg_timestamp=index,
            master_flushed_offset=master_flushed or None,
            confirm_phy_offset=confirm or None,
            physic_flushed_offset=flushed,
            logics_flushed_offset=logics_flushed,
        )

    def recovery_start_bound(self) -> int | None:
        """The lowest offset mqstore's fields say crash recovery must start at or before (the
        commitlog's and the queues' forced ends), None when neither counts."""
        offsets = [o for o in (self.physic_flushed_offset, self.logics_flushed_offset) if o is not None]
        return min(offsets) if offsets else None

    def min_timestamp(self) -> int:
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - _MIN_TIMESTAMP_MARGIN_MS)

    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp(), self.index_msg_timestamp)


def read_checkpoint(fs: FileSystem, path: str) -> CheckpointValues:
    """The values of a checkpoint file, read-only (for tools). Raises FileNotFoundError, and
    CheckpointError for a file that is not a checkpoint (check_checkpoint_bytes)."""
    size = fs.getsize(path)
    data = b""
    if size <= CHECKPOINT_FILE_SIZE:  # a longer one is refused unread (it may be anything, of any size)
        data = fs.read_bytes(path)
        size = len(data)
    check_checkpoint_bytes(data[:CHECKPOINT_FILE_SIZE], size, path)
    return CheckpointValues.unpack(data[:CHECKPOINT_FILE_SIZE])


def create_checkpoint_file(fs: FileSystem, path: str) -> None:
    """Create a new store's checkpoint with its blocks reserved, if it is not there yet:
    called before the store starts, so a disk with no room for it refuses the open instead of
    failing the flush actor's start again and again. DiskFullError, with no file left behind,
    when the disk has no room. A short one (cut, or a broker's older format) is padded here
    too, for the same reason (review 54 L1: a bare ENOSPC from the flush actor's start).
    CheckpointError, with the file unchanged, for one that is not a checkpoint."""
    if not fs.exists(path) or fs.getsize(path) != CHECKPOINT_FILE_SIZE:
        StoreCheckpoint(fs, path).close()
    else:
        read_checkpoint(fs, path)


class StoreCheckpoint:
    """The checkpoint, mapped. The timestamps change in memory; `flush()` writes and forces
    them. Not thread-safe: the flush actor owns it and the others report to it."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        self.path = path
        existed = fs.exists(path)
        values = CheckpointValues(physic_msg_timestamp=0, logics_msg_timestamp=0, index_msg_timestamp=0)
        if existed:
            # CheckpointError for a file that is not a checkpoint, before any byte of it changes.
            values = read_checkpoint(fs, path)
        if existed and fs.getsize(path) != CHECKPOINT_FILE_SIZE:
            # Java's map() silently extends a short file; our file layer maps exact sizes only,
            # so re-create it at 4096 bytes with the old content in front (a longer one was
            # refused above: it is no checkpoint, review 63 F2).
            old = fs.read_bytes(path)
            fs.write_atomic(path, old + bytes(CHECKPOINT_FILE_SIZE - len(old)))
        self._region = fs.map_file(path, CHECKPOINT_FILE_SIZE)
        # flush() writes through the map: with no block behind the page, that is SIGBUS. A
        # page that holds data has its block.
        # A new file's page is initialised by the reservation; an existing one holds data.
        self._unwritten_from = CHECKPOINT_FILE_SIZE if existed else 0
        self._backed = self._region.reserve(CHECKPOINT_FILE_SIZE, unwritten_from=self._unwritten_from) or bool(
            existed and fs.data_extents(path, 0, CHECKPOINT_FILE_SIZE)
        )
        if not self._backed and not existed:
            self._region.close()
            fs.remove(path)
            raise DiskFullError(f"no disk space for a new checkpoint file {path}")
        if existed:
            values = CheckpointValues.unpack(self._region.buf[:CHECKPOINT_FILE_SIZE])
        self.physic_msg_timestamp: int = values.physic_msg_timestamp
        # Set together with physic_msg_timestamp by the flush actor (None: not known).
        self.physic_flushed_offset: int | None = values.physic_flushed_offset
        # Set together with logics_msg_timestamp by the flush actor (None: not known).
        self.logics_flushed_offset: int | None = values.logics_flushed_offset
        self.logics_msg_timestamp: int = values.logics_msg_timestamp
        self.index_msg_timestamp: int = values.index_msg_timestamp
        self.master_flushed_offset: Final = values.master_flushed_offset
        # 5.x's; non-zero, it follows physic_flushed_offset at each flush (see the module).
        self.confirm_phy_offset: int | None = values.confirm_phy_offset
        self._closed = False

    def values(self) -> CheckpointValues:
        return CheckpointValues(
            physic_msg_timestamp=self.physic_msg_timestamp,
            logics_msg_timestamp=self.logics_msg_timestamp,
            index_msg_timestamp=self.index_msg_timestamp,
            master_flushed_offset=self.master_flushed_offset,
            confirm_phy_offset=self.confirm_phy_offset,
            physic_flushed_offset=self.physic_flushed_offset,
            logics_flushed_offset=self.logics_flushed_offset,
        )

    def get_min_timestamp(self) -> int:
        """max(0, min(physic, logics) - 3 s): where crash recovery may start."""
        return self.values().min_timestamp()

    def get_min_timestamp_index(self) -> int:
        """min(get_min_timestamp(), index): the start when messageIndexSafe is on."""
        return self.values().min_timestamp_index()

    def flush(self) -> None:
        """Write the three longs, 5.x's confirmPhyOffset where it is non-zero (never
        masterFlushedOffset), and mqstore's flushed offsets, and force. Raises OSError on I/O
        error."""
        if self._closed:
            raise OSError(errno.EBADF, "checkpoint is closed", self.path)
        if not self._backed:
            self._backed = self._region.reserve(CHECKPOINT_FILE_SIZE, unwritten_from=self._unwritten_from)
            if not self._backed:
                raise DiskFullError(f"no disk space for the checkpoint {self.path}")
        _THREE_LONGS.pack_into(
            self._region.buf, 0, self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp
        )
        buf = self._region.buf
        if self.confirm_phy_offset is not None and self.physic_flushed_offset is not None:
            # The physic flushed offset is forced before it reaches here: a confirm offset at it
            # claims no byte the disk may not hold.
            self.confirm_phy_offset = self.physic_flushed_offset
            struct.pack_into(">q", buf, _CONFIRM_AT, self.confirm_phy_offset)
        _pack_flushed(buf, _FLUSHED_AT, self.physic_flushed_offset, self.physic_msg_timestamp, _FLUSHED_CHECK)
        _pack_flushed(buf, _LOGICS_FLUSHED_AT, self.logics_flushed_offset, self.logics_msg_timestamp,
                      _LOGICS_FLUSHED_CHECK)  # fmt: skip
        self._region.flush(0, CHECKPOINT_FILE_SIZE)

    def close(self) -> None:
        """Unmap without flushing (4.4.0's shutdown flushes first, then closes)."""
        if not self._closed:
            self._closed = True
            self._region.close()
