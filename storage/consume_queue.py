"""A ConsumeQueue: dense 20-byte units per (topic, queueId) (spec §9, §11.4, §12.6).

<root>/consumequeue/<topic>/<queueId>/<20-digit start offset>; unit q lives at byte q * 20
of the virtual stream: (commitlog offset: long, size: int, tagsCode: long). No header, no
blank records. Derived data: rebuilt from the CommitLog when they disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

import errno
import itertools
import os
from collections.abc import Iterator
from typing import Callable, Final

from mqstore.log import get_logger
from mqstore.storage import scan
from mqstore.storage.codec import CQ_STORE_UNIT_SIZE, CQ_UNIT, FILLER_UNIT_SIZE, ReadBuffer, is_topic_name, jdiv
from mqstore.storage.fs import (
    OUT_OF_RESOURCES_ERRNOS, FileSystem, MappedRegion, RealFileSystem, UnreadDuringRecoveryError,
)
from mqstore.storage.mapped_file import MappedFile
from mqstore.storage.mapped_file_queue import MappedFileQueue, leading_units, trailing_units

__all__ = [
    "ConsumeQueue",
    "ConsumeQueueReader",
    "FILLER_UNIT",
    "FILLER_UNIT_SIZE",
    "is_filler",
    "cq_file_size",
    "iter_cq_units",
    "list_consume_queues",
    "make_topic_dir",
    "TopicDirectoryTaken",
]

log = get_logger(__name__)

# fillPreBlank's unit: valid by the offset >= 0 && size > 0 rule, pointing nowhere.
_RECOVER_CHUNK: Final = 4096 * CQ_STORE_UNIT_SIZE  # 80 KiB: the first read of a queue file at recovery
_RECOVER_CHUNK_MAX: Final = 64 * _RECOVER_CHUNK
_TORN_LOOK_BYTES: Final = 4096  # past a queue's last valid unit: a page (what a torn write-back spans)
_FIRST_REAL_CHUNK: Final = 256 * CQ_STORE_UNIT_SIZE  # 5 KiB: the first look past a queue file's leading fillers
FILLER_UNIT: Final = CQ_UNIT.pack(0, FILLER_UNIT_SIZE, 0)
# The largest run of skipped queue offsets filled with FILLER_UNITs; a larger jump is a
# damaged queue-offset field, not lost records (unless recovery reserved those offsets:
# `ConsumeQueue.reserved_until`).
MAX_FILLED_GAP_UNITS: Final = 100_000


_SCAN_CHUNK_BYTES: Final = 200 * CQ_STORE_UNIT_SIZE


def cq_file_size(configured: int) -> int:
    """`getMapedFileSizeConsumeQueue`: rounded up to a whole number of units."""
    return -(-configured // CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE


def _valid(offset: int, size: int) -> bool:
    return offset >= 0 and size > 0


def is_filler(offset: int, size: int) -> bool:
    """A filler unit: a lost or quarantined record's queue offset (RocketMQ's pre-blank unit),
    pointing at nothing."""
    return offset == 0 and size == FILLER_UNIT_SIZE


class ConsumeQueue:
    """One (topic, queueId) queue, written by its owner only. Not thread-safe."""

    def __init__(
        self,
        fs: FileSystem,
        topic: str,
        queue_id: int,
        consume_queue_root: str,
        *,
        mapped_file_size: int,
        clock_ms: Callable[[], int],
    ) -> None:
        self.fs = fs
        self.topic = topic
        self.queue_id = queue_id
        self.store_path = os.path.join(consume_queue_root, topic, str(queue_id))
        self.mapped_file_size = cq_file_size(mapped_file_size)
        self.mapped_file_queue = MappedFileQueue(fs, self.store_path, self.mapped_file_size, clock_ms=clock_ms)
        # 4.4.0: the commitlog offset (start) of the last unit written; the duplicate guard.
        self.max_physic_offset = -1
        # Smallest valid logical byte offset (units below it point at deleted data).
        self.min_logic_offset = 0
        # Queue offsets below it were handed out before recovery (its `reserved`): a jump up to
        # it, however long, is filled, never taken for a damaged queue-offset field.
        self.reserved_until = 0
        # Where `recover` cut the queue at a unit that was not all zeros (or with bytes after
        # it in its page): a torn or damaged unit, not the end of what was written.
        self.torn_at: int | None = None

    def __repr__(self) -> str:
        return f"ConsumeQueue({self.topic}-{self.queue_id})"

    def load(self) -> bool:
        ok = self.mapped_file_queue.load()
        log.info("consume queue loaded", topic=self.topic, queue_id=self.queue_id, ok=ok)
        return ok

    # recovery (§11.4) -----------------------------------------------------------------------
    def recover(self) -> None:
        """From the third-last file on, keep the units up to the first invalid one."""
        files = self.mapped_file_queue.mapped_files
        if not files:
            return
        index = max(0, len(files) - 3)
        mapped_file = files[index]
        process_offset = mapped_file.file_from_offset
        # The last real unit's commitlog offset: each next one lies past it (the walk's first
        # file is judged against the last unit of the file before it).
        after = self._last_offset_in(files[index - 1]) if index > 0 else -1
        while True:
            units, last, after, torn = self._valid_prefix(mapped_file, after)
            file_offset = units * CQ_STORE_UNIT_SIZE
            if units:
                self.max_physic_offset = last
            if file_offset == self.mapped_file_size:
                index += 1
                if index >= len(files):
                    process_offset = mapped_file.file_from_offset + file_offset
                    break
                mapped_file = files[index]
                continue
            process_offset = mapped_file.file_from_offset + file_offset
            self.torn_at = process_offset if torn else None
            break
        self.refuse_if_unread()  # zeros from a page that faulted are no end: nothing is cut on them
        if index < len(files) - 1 and self.fs.getsize(mapped_file.file_name) < self.mapped_file_size:
            # Cut short under the map (its lost pages read as a hole, no fault): files after it
            # say this is no end, and they are not deleted on it.
            raise UnreadDuringRecoveryError(mapped_file.file_name)
        queue = self.mapped_file_queue
        queue.flushed_where = queue.committed_where = process_offset
        queue.truncate_dirty_files(process_offset)
        self._skip_trailing_fillers()
        log.info("consume queue recovered", topic=self.topic, queue_id=self.queue_id, process_offset=process_offset)

    def _last_offset_in(self, mapped_file: MappedFile) -> int:
        """The commitlog offset of a full file's last unit (0 for a filler: no real unit after it
        points at 0), or -1 where it cannot be read as a unit."""
        data = mapped_file.read_data(self.mapped_file_size - CQ_STORE_UNIT_SIZE, self.mapped_file_size)
        if len(data) < CQ_STORE_UNIT_SIZE:
            return -1
        offset, size, _ = CQ_UNIT.unpack(data)
        return max(offset, -1) if size > 0 else -1

    def _valid_prefix(self, mapped_file: MappedFile, after: int) -> tuple[int, int, int, bool]:
        """`scan.cq_valid_prefix` of the file, read in growing chunks up to its first invalid
        unit: a queue's file is mostly its unwritten tail, and reading all 6 MB of each made
        an open of 5,000 queues outlast the start timeout (review 71 F3: ~7 ms a queue).
        Also whether a non-zero byte lies in the page past that unit's start: a torn unit
        (review 120 F2: half written, its record's offset and zero size), not unwritten space."""
        units, last, start, chunk = 0, -1, 0, _RECOVER_CHUNK
        torn = False
        while start < self.mapped_file_size:
            end = min(start + chunk, self.mapped_file_size)
            # Not the map itself: the unwritten tail is a hole, and on a full tmpfs a read
            # fault there dies with SIGBUS.
            data = mapped_file.read_data(start, end)
            data = data[: len(data) - len(data) % CQ_STORE_UNIT_SIZE]
            # The units up to the first invalid one (or one not past the one before it), in C.
            found, found_last, after = scan.cq_valid_prefix(data, after)
            if found:
                units, last = units + found, found_last
            if found * CQ_STORE_UNIT_SIZE < end - start:
                past = data[found * CQ_STORE_UNIT_SIZE : found * CQ_STORE_UNIT_SIZE + _TORN_LOOK_BYTES]
                torn = past.count(0) != len(past)
                break
            start, chunk = end, min(chunk * 2, _RECOVER_CHUNK_MAX)
        return units, last, after, torn

    # writing (§9.3) ---------------------------------------------------------------------------
    def put_message_position_info(self, commitlog_offset: int, size: int, tags_code: int, cq_offset: int) -> bool:
        """Append the unit for queue offset `cq_offset`. False: no file could be had / no room
        (the caller retries, then marks the logic queue broken)."""
        if commitlog_offset <= self.max_physic_offset:
            return True  # already there (re-dispatch during recovery)
        expect = cq_offset * CQ_STORE_UNIT_SIZE
        mapped_file = self.mapped_file_queue.get_last_mapped_file(expect)
        if mapped_file is None:
            log.error("no consume queue file", topic=self.topic, queue_id=self.queue_id, cq_offset=cq_offset)
            return False
        if mapped_file.first_create_in_queue and cq_offset != 0 and mapped_file.wrote_position == 0:
            # The queue's first file does not start at 0 (files removed, counter kept).
            self.min_logic_offset = expect
            self.mapped_file_queue.flushed_where = self.mapped_file_queue.committed_where = expect
            self._fill_pre_blank(mapped_file, expect)
            log.info("filled pre-blank units", topic=self.topic, queue_id=self.queue_id, until=expect)
        if cq_offset != 0:
            current = mapped_file.wrote_position + mapped_file.file_from_offset
            if expect < current:
                return self._unit_back(commitlog_offset, size, tags_code, expect, current)
            gap = (expect - current) // CQ_STORE_UNIT_SIZE
            if expect != current and (gap <= MAX_FILLED_GAP_UNITS or cq_offset <= self.reserved_until):
                # Records the commitlog lost (a hole) or quarantined (damaged header) left queue
                # offsets unused: filler units keep every later unit at its own queue offset.
                log.error("queue offsets skipped; filler units keep the queue dense", topic=self.topic,
                          queue_id=self.queue_id, first=current // CQ_STORE_UNIT_SIZE, until=cq_offset)  # fmt: skip
                if not self._fill_from(current, expect):
                    return False
                mapped_file = self.mapped_file_queue.get_last_mapped_file(expect)
                if mapped_file is None:
                    return False
            elif expect != current:
                # Java logs and appends at `current` anyway; the unit lands at the wrong offset.
                log.error("[BUG] logic queue order maybe wrong", topic=self.topic, queue_id=self.queue_id,
                          expect=expect, current=current)  # fmt: skip
        # Only once the unit is in: after a DiskFullError the same unit is dispatched again.
        if not mapped_file.append_bytes(CQ_UNIT.pack(commitlog_offset, size, tags_code)):
            return False
        self.max_physic_offset = commitlog_offset
        return True

    def _unit_back(self, commitlog_offset: int, size: int, tags_code: int, expect: int, current: int) -> bool:
        """A unit for a queue offset the queue already holds. If a filler unit holds it (an
        open found its record lost: the log ended early or had a hole), the record is back
        (the segment restored) and its unit takes the filler's place, as dispatch would have
        written it: no record ever claims another's queue offset, so this is the lost one.
        A real unit there stays (re-dispatch of what the queue has)."""
        files = self.mapped_file_queue
        holder = files.find_mapped_file_by_offset(expect)
        if holder is None or holder.file_from_offset > expect:
            return True
        pos = expect - holder.file_from_offset
        if holder.mapped_buffer[pos : pos + CQ_STORE_UNIT_SIZE] != FILLER_UNIT:  # below its write position
            log.warning("consume queue unit already written", topic=self.topic, queue_id=self.queue_id,
                        expect=expect, current=current)  # fmt: skip
            return True
        holder.rewrite_bytes(pos, CQ_UNIT.pack(commitlog_offset, size, tags_code))
        self.max_physic_offset = max(self.max_physic_offset, commitlog_offset)
        log.warning("a record the queue had lost is back: its unit replaces the filler", topic=self.topic,
                    queue_id=self.queue_id, queue_offset=expect // CQ_STORE_UNIT_SIZE,
                    commitlog_offset=commitlog_offset)  # fmt: skip
        return True

    def put_message_position_infos(self, units: Sequence[tuple[int, int, int, int]]) -> bool:
        """Units (commitlog offset, size, tags code, queue offset) of this queue, in dispatch
        order. A run that continues the queue exactly, is new and fits the current file is
        one append; anything else takes the unit-by-unit path with all of §9.3's rules."""
        first_offset, _, _, first_cq = units[0]
        mapped_file = self.mapped_file_queue.last_mapped_file
        if (
            mapped_file is not None
            and first_offset > self.max_physic_offset
            and units[-1][3] - first_cq == len(units) - 1
            and mapped_file.file_from_offset + mapped_file.wrote_position == first_cq * CQ_STORE_UNIT_SIZE
            and mapped_file.wrote_position + CQ_STORE_UNIT_SIZE * len(units) <= mapped_file.file_size
            and mapped_file.wrote_position > 0
            and all(units[i][0] < units[i + 1][0] for i in range(len(units) - 1))
        ):
            data = b"".join([CQ_UNIT.pack(offset, size, tags) for offset, size, tags, _ in units])
            if mapped_file.append_bytes(data):
                self.max_physic_offset = units[-1][0]
                return True
        return all(self.put_message_position_info(*unit) for unit in units)

    def put_dense_run(self, units: bytes, first_phy: int, last_phy: int, first_cq: int, count: int) -> bool:
        """`put_message_position_infos` for packed units with queue offsets first_cq.. and
        strictly rising commitlog offsets (as `_native.cq_runs` makes them)."""
        if last_phy <= self.max_physic_offset:
            return True  # all there already (re-dispatch over the units a crash kept)
        mapped_file = self.mapped_file_queue.last_mapped_file
        if (
            mapped_file is not None
            and first_phy > self.max_physic_offset
            and mapped_file.wrote_position > 0
            and mapped_file.file_from_offset + mapped_file.wrote_position == first_cq * CQ_STORE_UNIT_SIZE
            and mapped_file.wrote_position + len(units) <= mapped_file.file_size
            and mapped_file.append_bytes(units)
        ):
            self.max_physic_offset = last_phy
            return True
        return all(
            self.put_message_position_info(phy, size, tags, first_cq + i)
            for i, (phy, size, tags) in enumerate(CQ_UNIT.iter_unpack(units))
        )

    def _fill_from(self, current: int, expect: int) -> bool:
        """Filler units from logical byte offset `current` (the queue's end) to `expect`, in
        whole runs per file (a reserved gap can be millions of units). False: no room."""
        while current < expect:
            mapped_file = self.mapped_file_queue.get_last_mapped_file(current)
            if mapped_file is None:
                return False
            room = (mapped_file.file_size - mapped_file.wrote_position) // CQ_STORE_UNIT_SIZE
            run = min(room, (expect - current) // CQ_STORE_UNIT_SIZE)
            if run <= 0 or not mapped_file.append_bytes(FILLER_UNIT * run):
                return False
            current += run * CQ_STORE_UNIT_SIZE
        return True

    def fill_to(self, cq_offset: int) -> bool:
        """Filler units up to queue offset `cq_offset`, so the queue's next unit is there: the
        offsets recovery reserved for lost records, held on disk. A queue without files starts
        with the file holding `cq_offset - 1`: at least one filler unit then shows where the
        queue goes on (an empty file would be taken for one never written). False: no room."""
        expect = cq_offset * CQ_STORE_UNIT_SIZE
        queue = self.mapped_file_queue
        if queue.last_mapped_file is None:
            if cq_offset == 0:
                return True
            mapped_file = queue.get_last_mapped_file(expect - CQ_STORE_UNIT_SIZE)
            if mapped_file is None:
                return False
            self.min_logic_offset = expect
            queue.flushed_where = queue.committed_where = mapped_file.file_from_offset
            return self._fill_from(mapped_file.file_from_offset, expect)
        return self._fill_from(queue.max_offset(), expect)

    def last_real_unit(self) -> tuple[int, int, int] | None:
        """The newest unit that is not a filler, or None. A queue whose lost records' offsets
        are held by filler units ends with them: its newest unit points nowhere."""
        unit = CQ_STORE_UNIT_SIZE
        end = self.mapped_file_queue.max_offset()
        for mapped_file in reversed(self.mapped_file_queue.mapped_files):
            start = mapped_file.file_from_offset
            count = (min(end, start + self.mapped_file_size) - start) // unit
            if count <= 0:
                continue
            data = mapped_file.read_data(0, count * unit)
            low = trailing_units(data, FILLER_UNIT)
            self.refuse_if_unread()
            if low < count:
                found: tuple[int, int, int] = CQ_UNIT.unpack_from(data, (count - low - 1) * unit)
                return found
        return None

    def _skip_trailing_fillers(self) -> None:
        """`max_physic_offset` (the duplicate guard, and where re-dispatch resumes) is the
        newest real unit's: filler units point at commitlog offset 0."""
        if self.max_physic_offset == 0 and self.mapped_file_queue.max_offset() > 0:
            last = self.last_real_unit()
            self.max_physic_offset = last[0] if last is not None else -1

    def units_below(self, phy_offset: int) -> int:
        """The queue's max offset if `truncate_dirty_logic_files(phy_offset)` ran now, without
        changing anything (recovery notes what a cut will remove before it cuts)."""
        return self._cut_point(phy_offset) // CQ_STORE_UNIT_SIZE

    def _first_real_offset(self, mapped_file: MappedFile) -> int | None:
        """The commitlog offset of the file's first unit that is not a filler; None if it has
        none before its first invalid unit (a file of fillers only, or of nothing). Its first
        unit alone, unless that is a filler."""
        unit = CQ_STORE_UNIT_SIZE
        offset, size, _tags = CQ_UNIT.unpack(mapped_file.read_data(0, unit))
        self.refuse_if_unread()
        if not is_filler(offset, size):
            return offset if _valid(offset, size) else None
        # Past the leading fillers in growing reads (a crash open asks this of every queue, and
        # a rebuilt queue's first file starts with one: reading all 6 MB of each made a crash
        # open of 3,000 queues 12 times slower, review 111 F1).
        start, chunk = 0, _FIRST_REAL_CHUNK
        while start < self.mapped_file_size:
            end = min(start + chunk, self.mapped_file_size)
            data = mapped_file.read_data(start, end)
            self.refuse_if_unread()
            data = data[: len(data) - len(data) % unit]
            lead = leading_units(data, FILLER_UNIT)
            if lead < len(data) // unit:
                offset, size, _tags = CQ_UNIT.unpack_from(data, lead * unit)
                return int(offset) if _valid(offset, size) else None
            start, chunk = end, min(chunk * 4, _RECOVER_CHUNK_MAX)
        return None

    def _last_file_below(self, phy_offset: int) -> int:
        """The index of the last file whose first real unit points below `phy_offset` (0 if
        none does): a cut for a log ending there lies in it or after it. Its first unit a
        filler decides nothing (review 110 F3)."""
        files = self.mapped_file_queue.mapped_files
        for i in range(len(files) - 1, -1, -1):
            first = self._first_real_offset(files[i])
            if first is not None and first < phy_offset:
                return i
        return 0

    def _cut_point(self, phy_offset: int) -> int:
        """Where the queue ends once cut for a log that ends at `phy_offset`: at its first real
        unit pointing at or past it (units follow the log's order, so every later one does
        too), else at its first invalid unit or its last file's end. Fillers before that point
        stay: they hold the offsets of records not in the log. A file's first real unit
        decides where to start, not its first unit (review 110 F3: a filler, offset 0, lies
        below any cut, and a last file starting with one kept the units before it that point
        past the log's end)."""
        unit = CQ_STORE_UNIT_SIZE
        files = self.mapped_file_queue.mapped_files
        for mapped_file in files[self._last_file_below(phy_offset) :]:
            base = mapped_file.file_from_offset
            # The first unit alone decides a file that goes whole (every file of every queue when
            # a crash re-dispatches from the log's start): reading all of it took a third of
            # that recovery.
            offset, size, _tags = CQ_UNIT.unpack(mapped_file.read_data(0, unit))
            self.refuse_if_unread()
            if not _valid(offset, size) or (offset >= phy_offset and not is_filler(offset, size)):
                return base
            data = mapped_file.read_data(0, self.mapped_file_size)
            self.refuse_if_unread()
            for i, (offset, size, _tags) in enumerate(CQ_UNIT.iter_unpack(data[: len(data) - len(data) % unit])):
                if not _valid(offset, size) or (offset >= phy_offset and not is_filler(offset, size)):
                    return base + i * unit
        return files[-1].file_from_offset + self.mapped_file_size if files else 0

    def _fill_pre_blank(self, mapped_file: MappedFile, until_where: int) -> None:
        until = until_where % self.mapped_file_size
        if not mapped_file.append_bytes(FILLER_UNIT * (until // CQ_STORE_UNIT_SIZE)):
            raise ValueError(f"filler units up to {until_where} do not fit {mapped_file.file_name}")

    # reading (§9.4) ---------------------------------------------------------------------------
    def get_min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    def get_max_offset_in_queue(self) -> int:
        return self.mapped_file_queue.max_offset() // CQ_STORE_UNIT_SIZE

    def get_message_total_in_queue(self) -> int:
        return self.get_max_offset_in_queue() - self.get_min_offset_in_queue()

    def get_index_buffer(self, start_index: int) -> bytes | None:
        """The units from `start_index` to the end of that one file's readable data."""
        offset = start_index * CQ_STORE_UNIT_SIZE
        if offset < self.min_logic_offset:
            return None
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mapped_file is None:
            return None
        return mapped_file.select(offset % self.mapped_file_size)

    def get_unit(self, index: int) -> tuple[int, int, int] | None:
        """(commitlog offset, size, tagsCode) of unit `index`, if readable."""
        offset = index * CQ_STORE_UNIT_SIZE
        if offset < self.min_logic_offset:
            return None
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mapped_file is None:
            return None
        data = mapped_file.select(offset % self.mapped_file_size, CQ_STORE_UNIT_SIZE)
        if data is None:
            return None
        phy, size, tags = CQ_UNIT.unpack(data)
        return int(phy), int(size), int(tags)

    def roll_next_file(self, index: int) -> int:
        """The first queue offset of the file after the one holding `index`."""
        units_per_file = self.mapped_file_size // CQ_STORE_UNIT_SIZE
        return index + units_per_file - index % units_per_file

    def get_last_offset(self) -> int:
        """End (offset + size) of the message the last unit points at, or -1."""
        mapped_file = self.mapped_file_queue.last_mapped_file
        if mapped_file is None:
            return -1
        last_offset = -1
        position = max(mapped_file.wrote_position - CQ_STORE_UNIT_SIZE, 0)
        while position + CQ_STORE_UNIT_SIZE <= self.mapped_file_size:
            # Past wrote_position lies a hole: read_data, not the map (SIGBUS on a full tmpfs).
            chunk = mapped_file.read_data(position, position + _SCAN_CHUNK_BYTES)
            for offset, size, _tags in CQ_UNIT.iter_unpack(chunk[: len(chunk) - len(chunk) % CQ_STORE_UNIT_SIZE]):
                if not _valid(offset, size):
                    return last_offset
                last_offset = offset + size
                position += CQ_STORE_UNIT_SIZE
        return last_offset

    def get_offset_in_queue_by_time(
        self, timestamp: int, pickup_store_timestamp: Callable[[int, int], int], min_phy_offset: int
    ) -> int:
        """The queue offset of the message stored at `timestamp`, else its nearest neighbour
        (the earlier one on ties), by binary search in one file (§9.5)."""
        mapped_file = self.mapped_file_queue.get_mapped_file_by_time(timestamp)
        if mapped_file is None:
            return 0
        low = max(self.min_logic_offset - mapped_file.file_from_offset, 0)
        buf = mapped_file.select(0)
        if buf is None:
            return 0
        return offset_by_time_in_file(buf, mapped_file.file_from_offset, low, timestamp, pickup_store_timestamp,
                                      min_phy_offset)  # fmt: skip

    # maintenance (§9.6, §12.6) ---------------------------------------------------------------
    def truncate_dirty_logic_files(self, phy_offset: int) -> None:
        """Remove units pointing at or beyond `phy_offset` (the commitlog was truncated) and
        zero what they occupied (`_cut_point`)."""
        queue = self.mapped_file_queue
        cut = self._cut_point(phy_offset)
        while (last := queue.last_mapped_file) is not None and last.file_from_offset >= cut:
            # An invalid first unit: the file holds nothing (created, never durably written);
            # kept, its zero unit would read as a phantom unit.
            last.set_positions(0)
            queue.delete_last_mapped_file()
        if last is not None:
            last.set_positions(cut - last.file_from_offset)
            last.zero_from(last.wrote_position)
            # The duplicate guard: the newest real unit's (most often the one before the cut).
            before = CQ_UNIT.unpack(last.read_data(last.wrote_position - CQ_STORE_UNIT_SIZE, last.wrote_position)) if last.wrote_position else None
            if before is not None and _valid(before[0], before[1]) and not is_filler(before[0], before[1]):
                self.max_physic_offset = before[0]
            else:
                real = self.last_real_unit()
                self.max_physic_offset = real[0] if real is not None else -1
        else:
            self.max_physic_offset = phy_offset - 1
        queue.flushed_where = min(queue.flushed_where, queue.max_offset())
        queue.committed_where = min(queue.committed_where, queue.max_offset())

    def keep_units_matching(self, phy_offset: int, matches: Callable[[int, int, int, int], bool]) -> int:
        """After a crash: `truncate_dirty_logic_files(phy_offset)`, except that from the first
        unit pointing at or past `phy_offset` on, units stay while each is the one dispatch
        writes for the record it points at (`matches(commitlog_offset, size, tags_code,
        queue_offset)`); the queue is cut at the first that is not, a filler included (its
        record may be back). Returns how many units at or past `phy_offset` stayed.

        Kept, they are served at once and need no blocks: on a full disk every unit cut
        waited for space that never came, and the queue read as empty (review 46 M4)."""
        unit = CQ_STORE_UNIT_SIZE
        queue = self.mapped_file_queue
        files = queue.mapped_files
        end = queue.max_offset()
        first = self._last_file_below(phy_offset)  # the units to check begin in it
        checking = False
        kept = 0
        previous = -1
        cut: int | None = None
        for mapped_file in files[first:]:
            base = mapped_file.file_from_offset
            count = (min(end, base + self.mapped_file_size) - base) // unit
            if count <= 0:
                continue
            data = mapped_file.read_data(0, count * unit)
            for i, (offset, size, tags) in enumerate(CQ_UNIT.iter_unpack(data)):
                filler = is_filler(offset, size)
                if not checking:
                    if not _valid(offset, size):
                        cut = base + i * unit  # (recover() stopped before any such unit)
                        break
                    if filler or offset < phy_offset:
                        continue
                    checking = True
                if filler or offset <= previous or not matches(offset, size, tags, (base + i * unit) // unit):
                    cut = base + i * unit
                    break
                previous = offset
                kept += 1
            if cut is not None:
                break
        self.refuse_if_unread()
        if cut is not None:
            while (last := queue.last_mapped_file) is not None and last.file_from_offset >= cut:
                last.set_positions(0)  # emptied, it would read as a phantom unit: it goes
                queue.delete_last_mapped_file()
            if last is not None:
                last.set_positions(cut - last.file_from_offset)
                last.zero_from(last.wrote_position)
            queue.flushed_where = min(queue.flushed_where, queue.max_offset())
            queue.committed_where = min(queue.committed_where, queue.max_offset())
            real = self.last_real_unit()
            self.max_physic_offset = real[0] if real is not None else phy_offset - 1
        return kept

    def refuse_if_unread(self) -> None:
        """UnreadDuringRecoveryError naming a file of this queue whose map met a page it could
        not read: recovery read the guard's zeros there, which are no end, no invalid unit and
        no last unit, and cuts or deletes nothing on them (review 67 F3)."""
        mapped_file = self.mapped_file_queue.faulted_file()
        if mapped_file is not None:
            raise UnreadDuringRecoveryError(mapped_file.file_name)

    def correct_min_offset(self, phy_min_offset: int) -> None:
        """min_logic_offset := the first real unit of the first file pointing at or after
        `phy_min_offset` (unchanged if none does). Not a filler (review 110 F4: one at a
        queue's start, offset 0, was its first live unit while the log started at 0, and the
        queue's earliest message time read -1)."""
        mapped_file = self.mapped_file_queue.first_mapped_file
        if mapped_file is None:
            return
        data = mapped_file.select(0)
        if data is None:
            return
        for i, (offset, size, _tags) in enumerate(CQ_UNIT.iter_unpack(data[: len(data) - len(data) % CQ_STORE_UNIT_SIZE])):
            if offset >= phy_min_offset and not is_filler(offset, size):
                self.min_logic_offset = mapped_file.file_from_offset + i * CQ_STORE_UNIT_SIZE
                log.info("consume queue min offset corrected", topic=self.topic, queue_id=self.queue_id,
                         min_logic_offset=self.min_logic_offset)  # fmt: skip
                return

    def delete_expired_file(self, min_phy_offset: int) -> int:
        """Delete files whose messages are all gone from the commitlog; returns how many."""
        count = self.mapped_file_queue.delete_expired_file_by_offset(min_phy_offset, CQ_STORE_UNIT_SIZE, FILLER_UNIT)
        self.correct_min_offset(min_phy_offset)
        return count

    def flush(self, least_pages: int) -> bool:
        """True when nothing moved."""
        return self.mapped_file_queue.flush(least_pages)

    def unmap_files(self) -> bool:
        """Flush the queue's files and give their maps back (review 58 F2: every queue ever
        written kept a descriptor and a map per file for the store's life); each is mapped
        again at its next use, every position, the duplicate guard and the min offset kept.
        False when a file stays mapped (a failed flush: its pages must be written again)."""
        queue = self.mapped_file_queue
        for _ in range(len(queue.mapped_files) + 1):
            if queue.flush(0) or queue.last_io_error is not None:
                break
        return queue.unmap_files()

    def map_files(self) -> None:
        """The queue's files mapped again (MappedFileQueue.map_files)."""
        self.mapped_file_queue.map_files()

    def destroy(self) -> None:
        self.max_physic_offset = -1
        self.min_logic_offset = 0
        self.mapped_file_queue.destroy()


def offset_by_time_in_file(
    units: ReadBuffer,
    file_from_offset: int,
    low: int,
    timestamp: int,
    pickup_store_timestamp: Callable[[int, int], int],
    min_phy_offset: int,
) -> int:
    """getOffsetInQueueByTime's search in one file (§9.5): `units` are the file's written units
    from its start, `low` the byte position of the queue's first live unit in it. The queue
    offset of the message stored at `timestamp`, else its nearest neighbour (the earlier one
    on ties); 0 if a store time cannot be read. The owner and a reading thread both use it."""
    unit = CQ_STORE_UNIT_SIZE
    high = len(units) - len(units) % unit - unit
    left = right = target = -1
    left_value = right_value = -1
    while high >= low:
        mid = (low + high) // (2 * unit) * unit
        phy, size, _tags = CQ_UNIT.unpack_from(units, mid)
        if is_filler(phy, size):
            # No message and no time there (a quarantined or lost record's offset): the nearest
            # real unit in the range stands for it. Taken for a deleted message, it sent the
            # search right past its target; its store time read -1 answered 0 (review 110 F1, F2).
            real = _nearest_real_unit(units, mid, low, high)
            if real is None:
                break
            mid = real
            phy, size, _tags = CQ_UNIT.unpack_from(units, mid)
        if phy < min_phy_offset:  # the message is already deleted
            low = mid + unit
            left = mid
            continue
        store_time = pickup_store_timestamp(phy, size)
        if store_time < 0:
            return 0
        if store_time == timestamp:
            target = mid
            break
        if store_time > timestamp:
            high = mid - unit
            right = mid
            right_value = store_time
        else:
            low = mid + unit
            left = mid
            left_value = store_time
    if target == -1:
        if left_value == -1:
            target = right
        elif right_value == -1:
            target = left
        else:
            target = right if abs(timestamp - left_value) > abs(timestamp - right_value) else left
    # Java truncating division: target may be -1 (then start 0 gives 0, not -1).
    return jdiv(file_from_offset + target, unit)


def _nearest_real_unit(units: ReadBuffer, at: int, low: int, high: int) -> int | None:
    """The position of the first unit after `at` (up to `high`) that is not a filler, else of
    the last before it (down to `low`); None if [low, high] holds fillers only."""
    unit = CQ_STORE_UNIT_SIZE
    for position in itertools.chain(range(at + unit, high + 1, unit), range(at - unit, low - 1, -unit)):
        offset, size, _tags = CQ_UNIT.unpack_from(units, position)
        if not is_filler(offset, size):
            return position
    return None


# -------------------------------------------------------------------------------------------
class ConsumeQueueReader:
    """Read-only maps of consumequeue/ files for one reading thread (the store's `get`), as
    CommitLogReader is for the commitlog: no round trip to the owner. It knows nothing of
    which units are written; its caller reads only below the bounds the owner published.
    Not thread-safe."""

    MAPS_MAX: Final = 64  # files kept mapped; the least recently used beyond this are closed

    def __init__(self, fs: FileSystem, consume_queue_root: str, *, mapped_file_size: int) -> None:
        self.fs = fs
        self.root = consume_queue_root
        self.mapped_file_size = cq_file_size(mapped_file_size)
        self._maps: dict[tuple[str, int, int], MappedRegion] = {}  # insertion order = use order
        self._faults_seen = fs.map_faults()  # the process's map faults when these maps were last asked

    def read_units(self, topic: str, queue_id: int, offset: int, max_units: int) -> bytes | None:
        """Up to `max_units` units from queue offset `offset`, within its file; None if that
        file cannot be mapped (deleted, or not yet created at its full size)."""
        start = offset * CQ_STORE_UNIT_SIZE
        file_from = start - start % self.mapped_file_size
        key = (topic, queue_id, file_from)
        region = self._maps.pop(key, None)
        if region is None:
            path = os.path.join(self.root, topic, str(queue_id), f"{file_from:020d}")
            try:
                region = self._map(path)
            except (OSError, ValueError):
                return None
            while len(self._maps) >= self.MAPS_MAX:
                self._maps.pop(next(iter(self._maps))).close()
        self._maps[key] = region
        pos = start - file_from
        try:
            units = bytes(region.buf[pos : pos + min(max_units * CQ_STORE_UNIT_SIZE, self.mapped_file_size - pos)])
        except ValueError:  # closed underneath (the store closing)
            return None
        if self.fs.map_faults() != self._faults_seen and key in self._give_back_faulted():
            # The guard's zeros (a page that could not be read: an I/O error, or the file cut
            # meanwhile) read as units; a get took them for none and moved a consumer past the
            # file's units, and this map kept serving them after the disk read again. The
            # owner decides (its answer names an unread file); the next read maps it anew.
            return None
        return units

    def _map(self, path: str) -> MappedRegion:
        try:
            return self.fs.map_file(path, self.mapped_file_size, create=False, readonly=True)
        except OSError as exc:
            if exc.errno not in OUT_OF_RESOURCES_ERRNOS or not self._maps:
                raise
        # Short of maps or descriptors: this thread's own go back first, and the map is tried
        # again (review 91 B1: a busy reader kept 64 the other readers needed).
        self.forget()
        return self.fs.map_file(path, self.mapped_file_size, create=False, readonly=True)

    def _give_back_faulted(self) -> set[tuple[str, int, int]]:
        """Close the maps that met a page they could not read; their keys."""
        self._faults_seen = self.fs.map_faults()  # (first: a fault after this moves it again)
        faulted = {key for key, region in self._maps.items() if region.cut_short()}
        for key in faulted:
            self._maps.pop(key).close()
        return faulted

    def offset_by_time(
        self,
        topic: str,
        queue_id: int,
        bounds: tuple[int, int],
        timestamp: int,
        pickup_store_timestamp: Callable[[int, int], int],
        min_phy_offset: int,
    ) -> int | None:
        """getOffsetInQueueByTime (§9.5) within the owner's published `bounds` (min, max queue
        offset), as the owner answers it: in the first file modified at or after `timestamp`
        (else the last). None if that file cannot be read now (deleted underneath)."""
        min_offset, max_offset = bounds
        if max_offset <= 0:
            return 0
        unit = CQ_STORE_UNIT_SIZE
        directory = os.path.join(self.root, topic, str(queue_id))
        try:
            starts = sorted(int(n) for n in self.fs.listdir(directory) if len(n) == 20 and n.isdigit())
        except OSError:
            return None
        if not starts:
            return 0
        chosen = starts[-1]
        for start in starts:
            try:
                modified = self.fs.mtime_ms(os.path.join(directory, f"{start:020d}"))
            except OSError:
                modified = 0
            if modified >= timestamp:
                chosen = start
                break
        written = min(self.mapped_file_size, max_offset * unit - chosen)
        if written <= 0:
            return 0  # a file with no unit yet (as the owner's empty select answers)
        units = self.read_units(topic, queue_id, chosen // unit, written // unit)
        if units is None:
            return None
        low = max(min_offset * unit - chosen, 0)
        return offset_by_time_in_file(units, chosen, low, timestamp, pickup_store_timestamp, min_phy_offset)

    def forget(self) -> None:
        """Close every map: files were deleted (their space is freed once unmapped)."""
        for region in self._maps.values():
            region.close()
        self._maps.clear()

    close = forget


# Tools


def iter_cq_units(queue_dir: str, fs: FileSystem | None = None) -> Iterator[tuple[int, int, int, int]]:
    """(queue offset, commitlog offset, size, tagsCode) of every valid unit in a queue dir,
    files in offset order.

    Each file is read as the store's recovery reads it (`scan.cq_valid_prefix`): until its
    first unit that is unwritten, or not past the last real unit before it (torn: recovery
    cuts it and re-dispatch writes it again, so the read tools call it no damage: review 123
    F3); filler units (0, 0x7FFFFFFF, 0) are valid and yielded. Files are read whatever
    their size.
    """
    fs = fs or RealFileSystem()
    names = sorted(n for n in fs.listdir(queue_dir) if len(n) == 20 and n.isdigit())
    after = -1
    for name in names:
        start = int(name)
        data = fs.read_bytes(os.path.join(queue_dir, name))
        data = data[: len(data) - len(data) % CQ_STORE_UNIT_SIZE]
        units, _last, after = scan.cq_valid_prefix(data, after)
        for i, (offset, size, tags) in enumerate(CQ_UNIT.iter_unpack(data[: units * CQ_STORE_UNIT_SIZE])):
            yield (start + i * CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE, offset, size, tags


class TopicDirectoryTaken(OSError):
    """The filesystem gives a topic's name another topic's directory (it does not tell case
    apart: vfat, exFAT, SMB shares, WSL's /mnt/c, macOS's default APFS, ext4 with `chattr +F`)."""


def make_topic_dir(fs: FileSystem, consume_queue_root: str, topic: str) -> None:
    """consumequeue/<topic>/ made (durably) if missing, and checked to be `topic`'s own:
    where "orders" finds the directory of "Orders", the two topics' queues would be one set of
    files, each writing its units over the other's. Raises TopicDirectoryTaken then, and the
    filesystem's OSError for a name it cannot hold (vfat's EINVAL for "a|b") or a directory
    it cannot make (EACCES, ENOSPC, EROFS). A directory already there costs a listing of the
    root: callers ask once per topic."""
    path = os.path.join(consume_queue_root, topic)
    if not fs.isdir(path):
        fs.makedirs(path)  # not found under any spelling: made with this one
        return
    entries = fs.listdir(consume_queue_root)
    if topic in entries:
        return
    folded = topic.casefold()
    spelled = next((name for name in entries if name.casefold() == folded), None)
    found = repr(spelled) if spelled is not None else "an entry spelled otherwise"
    raise TopicDirectoryTaken(
        errno.EEXIST,
        f"the filesystem gives topic {topic!r} the directory of {found} (it does not tell upper and lower case "
        f"apart): the two topics' queues would be one set of files",
        path,
    )


def list_consume_queues(consume_queue_root: str, fs: FileSystem) -> list[tuple[str, int]]:
    """(topic, queueId) of every queue dir; sub-dirs whose name is not an int are skipped (§11.3),
    and so are entries not named as a topic may be (`old.bak`): not the store's, never loaded,
    cut or written (the open's link check leaves them alone on that ground, review 32)."""
    found: list[tuple[str, int]] = []
    if not fs.isdir(consume_queue_root):
        return found
    for topic in fs.listdir(consume_queue_root):
        if not is_topic_name(topic):
            log.warning("skipping a dir that is not named as a topic", path=os.path.join(consume_queue_root, topic))
            continue
        topic_dir = os.path.join(consume_queue_root, topic)
        if not fs.isdir(topic_dir):
            continue
        for name in fs.listdir(topic_dir):
            # Only a queue id's own spelling: "01" or "-1" would open another directory
            # (str(queue_id)) than the one found.
            if not name.isdigit() or name != str(int(name)) or int(name) > 0x7FFFFFFF:
                log.warning("skipping a dir that is not a queue id", path=os.path.join(topic_dir, name))
                continue
            if fs.isdir(os.path.join(topic_dir, name)):
                found.append((topic, int(name)))
            else:
                log.warning("skipping a file where a queue dir would be", path=os.path.join(topic_dir, name))
    return sorted(found)
