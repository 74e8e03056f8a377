"""CommitRealTimeService (spec §7.4), for the transient store pool only.

The writer owns both the write buffers and the segments, so committing (copying buffered
bytes into the file) is the writer's act; this actor is the clock that asks for it, with
RocketMQ's least-pages and thorough-interval rule.
"""

from __future__ import annotations

from typing import assert_never

from ..messages import (
    CommitWriteBuffers,
    Ping,
    Pong,
    Tick,
)
from .base import ActorContext, Periodic, StoreActor

__all__ = ["CommitRealTimeService"]


# What this actor takes; `handle` answers each with one reply type.
CommitRequest = Tick | Ping


class CommitRealTimeService(StoreActor[CommitRequest]):
    name = "commit"

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self._thorough = Periodic(ctx.ticker, ctx.config.commit_commitlog_thorough_interval_ms)

    def handle(self, message: CommitRequest) -> Pong | None:
        match message:
            case Tick():
                least_pages = self.config.commit_commitlog_least_pages
                if self._thorough.due():
                    least_pages = 0
                self.ctx.tell("writer", CommitWriteBuffers(least_pages=least_pages))
            case Ping():
                return Pong()
            case _:
                assert_never(message)
        return None
