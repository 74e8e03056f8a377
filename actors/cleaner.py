"""The cleaner: RocketMQ's CleanCommitLogService and CleanConsumeQueueService (spec §12).

It decides; each file's owner deletes (STYLE habit 1). Every `Tick` (clean_resource_interval_ms)
runs one round, in RocketMQ's order:

1. `deleteExpiredFiles` (§12.2-§12.4): time-up (the local hour of the injected clock is one of
   `delete_when`), space-full (a store partition above `disk_max_used_space_ratio_percent`) or a
   manual round left; above the forced ratio, with `clean_file_forcibly_enable` (off by default,
   unlike RocketMQ: see the README), files go regardless of age. The writer is asked to
   delete one segment at a time, at most DELETE_FILES_BATCH_MAX per round, and the cleaner
   pauses `delete_commitlog_files_interval_ms` between two of them, so the put path never sleeps.
   The disk check also drives DISK_FULL (§12.3, §14): above the warning ratio the writer refuses
   puts (`SetWriteable(writeable=False)`); at or below the forced ratio it takes them again.
2. `redeleteHangedFile` (§12.5): at most every `redelete_hanged_file_interval_ms`.
3. CleanConsumeQueueService (§12.6): when the commitlog's min offset moved, the ConsumeQueue
   actor deletes queue files (pausing `delete_consume_queue_files_interval_ms` after each queue
   that deleted some) and corrects min offsets, then the index actor deletes index files.

Time comes from the Tick (the store's injected clock); the disk level from a `DiskGauge`; the
pause from a sleep function. Both are per store, typed fields of the ActorContext set by
`mqstore.open(..., disk_gauge=..., cleaner_sleep_ms=...)`; by default psutil over the store
paths and a real sleep.
Operating trouble (a peer restarting, a slow answer) skips the rest of the round; the next
Tick retries. Nothing here raises into the supervisor for a full disk.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, assert_never

import pykka

from ..messages import (
    CleanRound,
    CommitLogFilesDeleted,
    ConsumeQueueFilesDeleted,
    DeleteExpiredCommitLogFiles,
    DeleteExpiredConsumeQueueFiles,
    DeleteExpiredIndexFiles,
    DeleteFilesManually,
    GetWriterStatus,
    Ping,
    Pong,
    RedeleteHangedCommitLogFile,
    Reply,
    SetWriteable,
    Tick,
    WriterReady,
)
from ..storage.disk import DiskGauge
from ..runtime import ask
from .base import ActorContext, ServiceUnavailable, StoreActor

__all__ = [
    "CleanerActor",
    "DELETE_FILES_BATCH_MAX",
    "MANUAL_DELETE_ROUNDS",
    "CLEAN_FIRST_DELAY_MS",
    "is_time_to_delete",
    "SpaceCheck",
    "check_space",
]

DELETE_FILES_BATCH_MAX = 10  # MappedFileQueue.DELETE_FILES_BATCH_MAX
MANUAL_DELETE_ROUNDS = 20  # executeDeleteFilesManually
CLEAN_FIRST_DELAY_MS = 60_000  # cleanFilesPeriodically first runs 60 s after start
# How far the wall clock may run ahead of the monotonic time since files were last aged and
# still count as time passing (`CleanerActor._retention_now_ms`): beyond, a jump.
CLOCK_JUMP_TOLERANCE_MS = 60_000
PEER_ANSWER_TIMEOUT_S = 30.0
CQ_DELETE_REQUESTS_MAX = 1_000_000  # one per queue that deleted files; a bound, not a loop until done


class _PeerDown(Exception):
    """A peer is restarting or did not answer: the round stops here, the next one retries."""


def is_time_to_delete(delete_when: str, now_ms: int) -> bool:
    """isTimeToDelete (§12.2): the local hour of `now_ms` is one of the ";"-separated hours."""
    hour = time.localtime(now_ms / 1000).tm_hour
    for part in delete_when.split(";"):
        part = part.strip()
        try:
            if int(part) == hour:
                return True
        except ValueError:
            continue  # Java logs the NumberFormatException and checks the next part
    return False


class SpaceCheck:
    """isSpaceToDelete's outcome: whether to delete, at any age, and the new DISK_FULL bit."""

    __slots__ = ("spacefull", "clean_immediately", "disk_full", "ratios")

    def __init__(self, spacefull: bool, clean_immediately: bool, disk_full: bool, ratios: tuple[float, ...]) -> None:
        self.spacefull = spacefull
        self.clean_immediately = clean_immediately
        self.disk_full = disk_full
        self.ratios = ratios


def check_space(
    paths: tuple[str, ...],
    gauge: DiskGauge,
    *,
    disk_full: bool,
    max_used_ratio: float,
    warning_ratio: float,
    forced_ratio: float,
) -> SpaceCheck:
    """isSpaceToDelete (§12.3), quirk included: each partition in turn sets or clears DISK_FULL,
    and the first one above `max_used_ratio` (or unreadable) ends the check. So a commitlog
    partition above the warning ratio but below `max_used_ratio` (possible only with a ratio
    above 90 %) is followed by the consume-queue partition, which clears DISK_FULL if healthy."""
    clean_immediately = False
    ratios: list[float] = []
    for path in paths:
        used = gauge.used_ratio(path)
        ratios.append(used)
        if used > warning_ratio:
            disk_full = True
            clean_immediately = True
        elif used > forced_ratio:
            clean_immediately = True
        else:
            disk_full = False
        if used < 0 or used > max_used_ratio:
            return SpaceCheck(True, clean_immediately, disk_full, tuple(ratios))
    return SpaceCheck(False, clean_immediately, disk_full, tuple(ratios))


# What this actor takes; `handle` answers each with one reply type.
CleanerRequest = Tick | DeleteFilesManually | Ping


class CleanerActor(StoreActor[CleanerRequest]):
    name = "cleaner"

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self._manual_rounds_left = 0
        self._last_redelete_ms: int | None = None  # monotonic
        self._last_physical_min_offset = 0
        self._disk_full = False
        self._first_run_ms = 0  # monotonic
        self.last_round: CleanRound | None = None
        # (wall, monotonic) when files were last aged by the wall clock, and since when the
        # wall clock has been ahead of it (0: it is not).
        self._aged_at: tuple[int, int] | None = None
        self._clock_ahead_since_ms = 0

    def on_start(self) -> None:
        # Paced by the monotonic ticker: the wall clock a Tick carries, stepped back by X, held
        # every round (the disk-full check with them) for X (review 108 F3).
        self._first_run_ms = self.ctx.ticker.now_ms() + CLEAN_FIRST_DELAY_MS
        self._aged_at = (self.ctx.clock_ms(), self.ctx.ticker.now_ms())

    # injected per store ----------------------------------------------------------------------
    @property
    def gauge(self) -> DiskGauge:
        return self.ctx.disk_gauge

    def _sleep_ms(self, ms: int) -> None:
        self.ctx.cleaner_sleep_ms(ms)

    # messages -----------------------------------------------------------------------------------
    def handle(self, message: CleanerRequest) -> CleanRound | Pong:
        match message:
            case Tick(now_ms=now_ms):
                if self.ctx.ticker.now_ms() < self._first_run_ms:
                    return CleanRound(ran=False)
                return self._round(now_ms)
            case DeleteFilesManually(reply=reply):
                self._manual_rounds_left = MANUAL_DELETE_ROUNDS
                self.log.info("manual deletion requested", rounds=MANUAL_DELETE_ROUNDS)
                result = self._round(self.ctx.clock_ms())
                if reply is not None:
                    reply.send(result)
                return result
            case Ping():
                return Pong()
            case _:
                assert_never(message)

    # one round: cleanFilesPeriodically ---------------------------------------------------------
    def _round(self, now_ms: int) -> CleanRound:
        cfg = self.config
        timeup = is_time_to_delete(cfg.delete_when, now_ms)
        space = check_space(
            (os.fspath(cfg.commitlog_dir), os.fspath(cfg.consume_queue_dir)),
            self.gauge,
            disk_full=self._disk_full,
            max_used_ratio=cfg.disk_max_used_space_ratio_percent / 100.0,
            warning_ratio=cfg.disk_space_warning_level_ratio,
            forced_ratio=cfg.disk_space_clean_forcibly_ratio,
        )
        self._set_disk_full(space.disk_full, space.ratios)
        manual = self._manual_rounds_left > 0
        clean_at_once = cfg.clean_file_forcibly_enable and space.clean_immediately
        commitlog_deleted = hanged_deleted = cq_deleted = index_deleted = 0
        min_offset = -1
        try:
            if timeup or space.spacefull or manual:
                if manual:
                    self._manual_rounds_left -= 1
                commitlog_deleted = self._delete_commitlog_files(clean_at_once)
                if commitlog_deleted == 0 and space.spacefull:
                    self.log.warning("disk space will be full soon, but delete file failed", ratios=space.ratios)
            # Segments gone, their queues' files not yet: the next round's (or a restarted
            # cleaner's) queue cleaning catches up.
            self.ctx.faults.hit("cleaner.mid_delete")
            hanged_deleted = self._redelete_hanged_file()
            min_offset = self._writer_min_offset()
            cq_deleted, index_deleted = self._clean_consume_queues(min_offset)
        except _PeerDown as exc:
            self.log.warning("cleaning round cut short", reason=str(exc))
        result = CleanRound(
            ran=True,
            timeup=timeup,
            spacefull=space.spacefull,
            manual=manual,
            clean_immediately=clean_at_once,
            disk_full=self._disk_full,
            commitlog_deleted=commitlog_deleted,
            hanged_deleted=hanged_deleted,
            consume_queue_deleted=cq_deleted,
            index_deleted=index_deleted,
            min_offset=min_offset,
        )
        if commitlog_deleted or hanged_deleted or cq_deleted or index_deleted:
            self.log.info("expired files deleted", commitlog=commitlog_deleted, hanged=hanged_deleted,
                          consume_queue=cq_deleted, index=index_deleted, min_offset=min_offset)  # fmt: skip
        self.last_round = result
        return result

    def _set_disk_full(self, disk_full: bool, ratios: tuple[float, ...]) -> None:
        """RunningFlags.DISK_FULL, held by the writer as "not writeable". Re-told every round
        while set, so a writer that restarted (writeable again) is told again."""
        if disk_full != self._disk_full:
            if disk_full:
                self.log.error("disk full, the store refuses puts", ratios=ratios)
            else:
                self.log.info("disk space ok, the store takes puts again", ratios=ratios)
        if disk_full or disk_full != self._disk_full:
            self.ctx.tell("writer", SetWriteable(writeable=not disk_full))
        self._disk_full = disk_full

    # CleanCommitLogService ------------------------------------------------------------------------
    def _delete_commitlog_files(self, clean_immediately: bool) -> int:
        """deleteExpiredFileByTime (§12.4), one segment per request, paused between two."""
        cfg = self.config
        deleted = 0
        while deleted < DELETE_FILES_BATCH_MAX:
            answer: CommitLogFilesDeleted = self._ask(
                "writer",
                lambda reply: DeleteExpiredCommitLogFiles(
                    expired_ms=cfg.file_reserved_time_ms,
                    forcibly_ms=cfg.destroy_mapped_file_interval_forcibly_ms,
                    clean_immediately=clean_immediately,
                    now_ms=self._retention_now_ms(),
                    max_files=1,
                    reply=reply,
                ),
            )
            if answer.deleted == 0:
                break
            deleted += answer.deleted
            # Java pauses only when another file that may be deleted follows (not the newest).
            if deleted < DELETE_FILES_BATCH_MAX and answer.file_count > 1 and cfg.delete_commitlog_files_interval_ms > 0:
                self._sleep_ms(cfg.delete_commitlog_files_interval_ms)
        return deleted

    def _redelete_hanged_file(self) -> int:
        cfg = self.config
        ticked_ms = self.ctx.ticker.now_ms()
        if self._last_redelete_ms is not None and ticked_ms - self._last_redelete_ms <= cfg.redelete_hanged_file_interval_ms:
            return 0
        self._last_redelete_ms = ticked_ms
        answer: CommitLogFilesDeleted = self._ask(
            "writer",
            lambda reply: RedeleteHangedCommitLogFile(
                forcibly_ms=cfg.destroy_mapped_file_interval_forcibly_ms, now_ms=self._retention_now_ms(), reply=reply
            ),
        )
        return answer.deleted

    def _retention_now_ms(self) -> int:
        """The time files are aged by: the wall clock, but no further ahead than the monotonic
        clock has moved since files were last aged (plus CLOCK_JUMP_TOLERANCE_MS). File mtimes
        are wall time, so a clock stepped forward (a VM restored, an RTC wrong at boot that NTP
        then set) made segments written minutes before look days old, and retention deleted
        unconsumed messages long before `file_reserved_time` had passed (review 57 F2, as
        RocketMQ does). While the clock stays ahead, files are aged by the time this process has
        seen pass: those written after the jump wait, and the disk may fill (puts refused,
        loudly) rather than messages go early. A clock stepped back is followed."""
        wall, monotonic = self.ctx.clock_ms(), self.ctx.ticker.now_ms()
        aged_at = self._aged_at
        expected = wall if aged_at is None else aged_at[0] + (monotonic - aged_at[1])
        if wall <= expected + CLOCK_JUMP_TOLERANCE_MS:
            if self._clock_ahead_since_ms:
                self.log.warning("the clock is back within reach of the time the store has seen pass; files "
                                 "are aged by it again", clock_ms=wall)  # fmt: skip
                self._clock_ahead_since_ms = 0
            self._aged_at = (wall, monotonic)
            return wall
        if not self._clock_ahead_since_ms:
            self._clock_ahead_since_ms = wall
            self.log.error("the clock jumped ahead of the time the store has seen pass: files are aged by the "
                           "latter, so no segment is deleted before its time; those written after the jump are "
                           "kept until the store is opened again", clock_ms=wall, aged_by_ms=expected,
                           ahead_ms=wall - expected)  # fmt: skip
        return expected

    def _writer_min_offset(self) -> int:
        ref = self.ctx.peers.get("writer")
        if ref is None:
            raise _PeerDown("writer is not running")
        try:
            ready: WriterReady = ask(ref, GetWriterStatus(), timeout_s=PEER_ANSWER_TIMEOUT_S)
        except (pykka.ActorDeadError, pykka.Timeout) as exc:
            raise _PeerDown(f"writer: {exc!r}") from exc
        return ready.min_offset

    # CleanConsumeQueueService ---------------------------------------------------------------------
    def _clean_consume_queues(self, min_offset: int) -> tuple[int, int]:
        if min_offset <= self._last_physical_min_offset:
            return 0, 0  # the commitlog's head did not move
        cfg = self.config
        cq_deleted = 0
        start_after: tuple[str, int] | None = None
        for _ in range(CQ_DELETE_REQUESTS_MAX):
            answer: ConsumeQueueFilesDeleted = self._ask(
                "consume_queue",
                lambda reply: DeleteExpiredConsumeQueueFiles(min_phy_offset=min_offset, start_after=start_after, reply=reply),
            )
            if answer.last_queue is None:
                break
            cq_deleted += answer.deleted
            start_after = answer.last_queue
            if cfg.delete_consume_queue_files_interval_ms > 0:
                self._sleep_ms(cfg.delete_consume_queue_files_interval_ms)
        index_deleted = 0
        if "index" in self.ctx.peers:
            index_deleted = self._ask(
                "index", lambda reply: DeleteExpiredIndexFiles(min_phy_offset=min_offset, reply=reply)
            )
        # Only once every owner has done it: a peer that was restarting is asked again next round.
        self._last_physical_min_offset = min_offset
        return cq_deleted, index_deleted

    # asking a file's owner --------------------------------------------------------------------
    def _ask(self, peer: str, build: Callable[[Reply[Any]], Any]) -> Any:
        """Tell `peer` a request carrying a reply, and wait for the answer (the owner changes its
        files; we only wait). A peer that is down or failed raises _PeerDown."""
        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        if not self.ctx.tell(peer, build(Reply(future=future, store_internal_callback=True))):
            raise _PeerDown(f"{peer} is not running")
        try:
            return future.get(timeout=PEER_ANSWER_TIMEOUT_S)
        except pykka.Timeout as exc:
            raise _PeerDown(f"{peer} did not answer in {PEER_ANSWER_TIMEOUT_S} s") from exc
        except ServiceUnavailable as exc:  # the owner crashed or stopped holding the request
            raise _PeerDown(f"{peer} failed: {exc!r}") from exc
