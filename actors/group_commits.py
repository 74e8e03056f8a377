"""The group commits a sync flush has not answered yet, for the store's run.

Under SYNC_FLUSH the writer hands each stored put's answer to the flush actor, which answers it
once the log is forced past it (RocketMQ's GroupCommitService). An msync that hangs holds that
actor, and with it every such answer: the caller was told nothing, or "not stored" by its own
timeout, of a put that is stored (a retrying producer stores it twice). So the writer also
notes each request here, and the supervisor answers one left unanswered a grace past its
deadline FLUSH_DISK_TIMEOUT (stored, not known to be on disk), as RocketMQ does after
syncFlushTimeout. Kept in the ActorContext, not in a writer: a restarted writer's requests are
still in the stuck flush actor (review 140 F1), and the supervisor's tick runs whatever the
writer's interval is (F3) and through a close (F2); a close or a give-up answers what is left
before it stops the actors. A Reply is answered once, whichever comes first."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Final

from ..log import get_logger
from ..messages import GroupCommitRequest, PutResult
from ..storage.status import PutMessageStatus

__all__ = ["GROUP_COMMIT_EXPIRY_GRACE_NS", "GroupCommitWatch"]

# How long past its deadline a group commit waits for the flush actor before it is answered
# from here: the flush actor expires its own on its tick, and a flush that is only slow (a
# loaded machine) still answers first; this answer is for one stuck in an msync, and comes well
# before the caller's own timeout (sync_flush_timeout_ms + 15 s). With 1 s, a loaded CI run got
# FLUSH_DISK_TIMEOUT under a 500 ms timeout where the flush actor answered PUT_OK before.
GROUP_COMMIT_EXPIRY_GRACE_NS: Final = 5_000_000_000


class GroupCommitWatch:
    """Oldest first. The writer adds (its thread only); answered ones are dropped from the
    front as the writer passes, so the deque holds about what the flush has not reached (review
    140 F4: kept to their deadlines, 430,000 answered requests, ~365 MB at 40k puts/s)."""

    def __init__(self) -> None:
        self._waiting: deque[GroupCommitRequest] = deque()
        self._lock = threading.Lock()  # the removals: the writer's thread and the supervisor's

    def add(self, request: GroupCommitRequest) -> None:
        self._waiting.append(request)

    def __len__(self) -> int:
        return len(self._waiting)

    def drop_answered(self) -> None:
        self._take(expired_before=-1)  # (no deadline is that early: only answered ones go)

    def expire(self, now_ns: int | None = None) -> int:
        """Answer FLUSH_DISK_TIMEOUT to those a grace past their deadline; how many."""
        due = self._take(expired_before=(time.monotonic_ns() if now_ns is None else now_ns) - GROUP_COMMIT_EXPIRY_GRACE_NS)
        _answer(due, "flush too slow (stalled)")  # outside the lock: the writer never waits on a delivery
        return len(due)

    def answer_all(self, detail: str) -> int:
        """The store stops or is given up: every one left is stored and not known to be on
        disk."""
        due = self._take(expired_before=None)
        _answer(due, detail)
        return len(due)

    def _take(self, *, expired_before: int | None) -> list[GroupCommitRequest]:
        """From the front, never iterated (the writer may add meanwhile): answered ones
        dropped, unanswered ones taken up to the first whose deadline is not before
        `expired_before` (None: all)."""
        due: list[GroupCommitRequest] = []
        waiting = self._waiting
        with self._lock:
            while waiting:
                head = waiting[0]
                if not head.reply.answered:
                    if expired_before is not None and head.deadline_ns > expired_before:
                        break
                    due.append(head)
                waiting.popleft()
        return due


def _answer(due: list[GroupCommitRequest], detail: str) -> None:
    for request in due:
        answer: PutResult = request.result.with_status(PutMessageStatus.FLUSH_DISK_TIMEOUT, detail)
        try:
            request.reply.send(answer)
        except Exception as exc:  # the pipeline's own sink; the rest are still owed their answers
            get_logger("mqstore.group_commits").error("a stalled group commit's answer failed", error=repr(exc))
