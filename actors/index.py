"""The index actor: owns index/ (spec §10.8). Keys are `topic#UNIQ_KEY` and `topic#<each KEYS token>`."""

from __future__ import annotations

from collections import deque
from typing import assert_never

from ..messages import (
    DeleteExpiredIndexFiles,
    DispatchBatch,
    DispatchRequest,
    FlushAll,
    GetIndexSnapshot,
    IndexFileFlushed,
    IndexSnapshot,
    Ping,
    Pong,
    QueryOffsets,
    QueryOffsetsReply,
    Tick,
)
from ..storage.checkpoint import CheckpointValues
from ..storage.fs import UnreadPageError
from ..storage.index import IndexService
from ..storage.index_progress import IndexProgress, load_index_progress, write_index_progress
from ..storage.recovery import IndexRecovery, LogFacts, RecoveryMode, recover_index
from .base import ActorContext, HeldWait, StoreActor

__all__ = ["IndexActor"]


# What this actor takes; `handle` answers each with one reply type.
IndexRequest = DispatchBatch | QueryOffsets | GetIndexSnapshot | FlushAll | DeleteExpiredIndexFiles | Tick | Ping


class IndexActor(StoreActor[IndexRequest]):
    name = "index"

    def __init__(
        self, ctx: ActorContext, *, mode: RecoveryMode, checkpoint: CheckpointValues | None, log_facts: LogFacts
    ) -> None:
        super().__init__(ctx)
        self._mode = mode
        self._checkpoint = checkpoint
        self._log_facts = log_facts
        self._recovered: IndexRecovery | None = None
        self._service: IndexService | None = None
        self._dispatched_offset = 0
        self._indexed_below = 0  # readers are told: every key of the messages below is in
        self._skip_below = 0  # build_index skips records below (a replay of what the files hold)
        self._published_names: tuple[str, ...] = ()
        self._progress_written: IndexProgress | None = None
        # Batches not yet indexed because the disk had no blocks for their entries or no index
        # file could be made, oldest first; the first is done below `_resume_at` (and past its middle if `_middle_done`).
        # Retried on every tick and batch: dispatch waits for space, it does not crash.
        self._waiting: deque[DispatchBatch] = deque()
        self._resume_at = 0
        self._middle_done = False
        self._held = HeldWait(self.log, "indexing")
        self._hold_cause = ("", "")  # why the last build stopped early: (what, the error)

    def on_start(self) -> None:
        cfg = self.config
        # This owner's part of recovery, the same on a first start and on every restart: files
        # that are not safe to keep go (after a crash, any that is not full), and so do files
        # past the log's end; what they held is indexed again by re-dispatch.
        self._recovered = recover_index(cfg, self.ctx.fs, mode=self._mode, checkpoint=self._checkpoint,
                                        log_facts=self._log_facts, clock_ms=self.ctx.clock_ms)  # fmt: skip
        self._service = IndexService(
            self.ctx.fs,
            cfg.index_dir,
            clock_ms=self.ctx.clock_ms,
            max_hash_slot_num=cfg.max_hash_slot_num,
            max_index_num=cfg.max_index_num,
            max_msgs_num_batch=cfg.max_msgs_num_batch,
            on_index_file_full=self._file_full,
            on_flush_failed=self._flush_failed,
        )
        # Recovery (above) dropped the files that were not safe to keep (§10.8 load).
        if not self._service.load(last_exit_ok=True, index_msg_timestamp=0):
            raise RuntimeError(f"cannot load the index in {cfg.index_dir}")
        # Records below this offset are indexed already. The newest file's endPhyOffset is the
        # START of the last indexed message, which may be indexed only in part (its keys split
        # across a full file and a newer one recovery dropped): it is indexed again, as in Java,
        # and build_index skips the keys already there.
        self._indexed_below = self._skip_below = self._service.resume_offset()
        # Where re-dispatch must start for the index (the supervisor starts reput no later).
        # An open's recovery decided it: a clean stop indexed everything (the log's end), a
        # crash or a dropped file names its start. A restart in a live process trusts the
        # files up to the newest entry (messages without keys after it left no trace).
        self._dispatched_offset = self._indexed_below
        if self._mode is not RecoveryMode.RESTART:
            needed = self._recovered.dispatch_from
            self._dispatched_offset = needed if needed is not None else self._log_facts.max_offset
            if needed is None:
                # Recovery found every message up to the log's end indexed. The newest file's
                # endPhyOffset says less when the last messages had no keys (0 when none had):
                # readers were told so, and an open with nothing to re-dispatch (units cut back
                # to the log's end after it lost its tail) waited for an index that never moved.
                # Only readers are told: a re-dispatch for the queues still indexes what it
                # brings past the files' end.
                self._indexed_below = max(self._indexed_below, self._log_facts.max_offset)
        if self._log_facts.holes:
            # A degraded log ends short of where indexing got (its last segments cut short or
            # missing, review 32 P1): the progress keeps the offset it has, so a degraded open
            # writes nothing, and the segments put back whole need no re-index.
            on_disk = load_index_progress(self.ctx.fs, self.config.index_progress_path)
            names = tuple((f.name, f.end_phy_offset) for f in self._service.files)
            if on_disk is not None and on_disk.files == names and self._indexed_below < on_disk.indexed_below <= self._log_facts.reach:
                self._indexed_below = on_disk.indexed_below
        self._publish()

    def _publish(self) -> None:
        """Tell readers which files there are and how far indexing has got (the read view). The same names tuple is handed on while the files are unchanged, so a
        reader tells "nothing to map or unmap" by identity."""
        assert self._service is not None
        names = tuple(f.name for f in self._service.files)
        if names != self._published_names:
            self._published_names = names
        self.ctx.read_view.publish_index(self._published_names, self._indexed_below)

    def release(self) -> None:
        if self._service is not None:
            self._service.close()
            self._service = None

    def _file_full(self, end_timestamp: int) -> None:
        self.ctx.tell("flush", IndexFileFlushed(index_msg_timestamp=end_timestamp))

    def _flush_failed(self) -> None:
        # Linux reports a failed writeback once: a later flush of the file "succeeds" without
        # writing it, so no later flush is believed in this run (ActorContext.derived_flush_failed).
        self.ctx.derived_flush_failed = True

    def _build(self, service: IndexService, requests: tuple[DispatchRequest, ...], start: int, stop: int) -> int:
        """Index requests[start:stop]; where it stopped (`stop` unless the disk is full or no
        index file could be made: then the batch waits, retried on the ticks)."""
        with self._held.quiet():
            done = service.build_index_until_full(requests, start, stop, self._skip_below)
        if done < stop and service.disk_full is None and service.index_error:
            # RocketMQ sets WRITE_INDEX_FILE_ERROR here and refuses every put until a restart;
            # a crash here restarted the actor until the supervisor gave up (the same: every
            # put refused). The index is derived from the log: it waits, as on a full disk, and
            # the store goes on taking puts. A retry re-indexes the message it stopped in; its
            # keys already in a file are skipped (build_index is idempotent).
            service.index_error = False
            self._hold_cause = ("cannot create an index file", service.last_create_error or "unknown")
            return done
        if service.disk_full is not None:
            self._hold_cause = ("disk full", str(service.disk_full))
            return done
        return stop

    def _index_waiting(self, service: IndexService) -> None:
        """Index the waiting batches in order; stop where the disk has no room."""
        waiting = self._waiting
        while waiting:
            batch = waiting[0]
            requests = batch.requests
            middle = len(requests) // 2
            if not self._middle_done:
                self._resume_at = self._build(service, requests, self._resume_at, middle)
                if self._resume_at < middle:
                    self._hold(service)
                    return
                if requests:
                    self.ctx.faults.hit("index.mid_write")
                self._middle_done = True
            self._resume_at = self._build(service, requests, max(self._resume_at, middle), len(requests))
            if self._resume_at < len(requests):
                self._hold(service)
                return
            waiting.popleft()
            self._resume_at = 0
            self._middle_done = False
            self._dispatched_offset = max(self._dispatched_offset, batch.end_offset)
            self._indexed_below = max(self._indexed_below, batch.end_offset)
            self._publish()
            self._held.ended(self.ctx.clock_ms())  # at once: the rest of the backlog is not a retry

    def _write_progress(self, service: IndexService) -> None:
        """Record how far the index got, after a flush of every file (storage.index_progress):
        the next open re-dispatches from there if the log went further without the index."""
        progress = IndexProgress(self._indexed_below, tuple((f.name, f.end_phy_offset) for f in service.files))
        if progress != self._progress_written and write_index_progress(
            self.ctx.fs, self.config.index_progress_path, progress
        ):
            self._progress_written = progress  # a store.flush() with nothing new writes nothing

    def _hold(self, service: IndexService) -> None:
        why, error = self._hold_cause
        self._held.failed(self.ctx.clock_ms(), why, error, waiting_batches=len(self._waiting))

    def handle(self, message: IndexRequest) -> QueryOffsetsReply | IndexSnapshot | Pong | None:
        service = self._service
        assert service is not None
        match message:
            case DispatchBatch():
                # Records below _indexed_below are a replay after a restart.
                self._waiting.append(message)
                if not self._held:  # waiting for space: the ticks retry
                    self._index_waiting(service)
            case Tick():
                self._index_waiting(service)
            case QueryOffsets(topic=topic, key=key, max_num=max_num, begin_ms=begin, end_ms=end):
                offsets, last_ts, last_phy = service.query_offset(topic, key, max_num, begin, end)
                faulted = service.faulted_file()
                if faulted is not None:
                    # Its slots and entries read as the guard's zeros: no hits is not the answer
                    # (review 87 F3: every query after the first report said "no message").
                    raise UnreadPageError(faulted.path, "its hits are not in this answer; the file was cut short "
                                                        "under the index's map: see stats() files_cut_under_map")
                return QueryOffsetsReply(
                    offsets=tuple(offsets), last_update_timestamp=last_ts, last_update_phy_offset=last_phy
                )
            case GetIndexSnapshot():
                return IndexSnapshot(resume_offset=self._dispatched_offset, waiting_batches=len(self._waiting),
                                     recovered=self._recovered)  # fmt: skip
            case Ping():
                return Pong()
            case FlushAll(reply=reply):
                self._index_waiting(service)  # once: close() is not held up by a full disk
                service.flush_all()
                self._write_progress(service)
                reply.send(self._dispatched_offset)
            case DeleteExpiredIndexFiles(min_phy_offset=min_phy_offset, reply=reply):
                deleted = service.delete_expired_file(min_phy_offset)
                if deleted:
                    self._publish()
                reply.send(deleted)
            case _:
                assert_never(message)
        return None
