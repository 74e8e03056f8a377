"""The store for asyncio: `store = await mqstore.aio.open(path)` (or `async with
mqstore.aio.open(path) as store:`), then `await store.put(m)`, `get`, `query`,
`wait_for_messages`, `flush`, `close`.

The same store (`.sync` is the MessageStore) without what a coroutine must not do with it (review
75, which found each of these in an asyncio service using the plain API):
- Never blocks the event loop. A put at the in-flight bound waits for room by sleeping, not in
  the loop's thread (`put_async` there blocked the loop up to the reply timeout, 20 s a call);
  reads, flush, open and close run on the aio store's own threads.
- Reads its own writes per task: a read runs on another thread, for the loop's thread, whose
  read-your-writes end covers every put its tasks saw stored (the read contract is per thread:
  through to_thread a task's get of the put it had just awaited answered OFFSET_OVERFLOW_BADLY
  with next_begin_offset=0).
- A long poll can be cancelled: `wait_for_messages` waits in slices of at most
  WAIT_SLICE_S, so a cancelled wait holds no thread past its slice (through asyncio.to_thread,
  a cancelled `timeout_s=math.inf` wait kept its thread for good, and `asyncio.run()` never
  returned).

Cancelling an awaited put abandons the wait, not the put: once handed to the writer it is
stored or refused as it would have been (a put still waiting for room in the bound is not
sent). A caller that retries after a cancel or a timeout may store the message twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import math
import os
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Final, Generator, Sequence, TypeVar, Unpack

from .messages import GetResult, Message, PutResult, QueryResult
from .put_pipeline import BYTES_IN_FLIGHT_FULL, IN_FLIGHT_FULL
from .waits import StoreThread

if TYPE_CHECKING:
    from .config import StoreSettings
    from .store import MessageStore

__all__ = ["AsyncMessageStore", "open", "WAIT_SLICE_S"]

# A cancelled wait_for_messages holds its thread at most this long.
WAIT_SLICE_S: Final = 0.25
# Reads, waits and the rest run on this many threads per store at most (its own pool: a host's
# default executor is left to the host, and long polls do not starve it).
DEFAULT_THREADS: Final = 32
# How often a put at the in-flight bound looks for room again (doubling up to the last).
_ROOM_PAUSE_S: Final = (0.0005, 0.01)

T = TypeVar("T")


class AsyncMessageStore:
    """A MessageStore for coroutines (see the module). Make it with `mqstore.aio.open(...)` or
    around an open store, `AsyncMessageStore(store)`; one event loop or several may use it."""

    def __init__(self, store: MessageStore, *, threads: int = DEFAULT_THREADS) -> None:
        self.sync = store
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mqstore-aio")

    async def _on_thread(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`call` on the store's threads, reading for the loop's thread (MessageStore.reading_after):
        its end covers every put its tasks saw stored, whichever task awaited it (a task's own
        context missed puts awaited through wait_for or gather, review 77 M2)."""
        store = self.sync
        store._check_open()  # StoreClosedError, not the closed executor's RuntimeError (review 77 L3)
        # On the loop's thread: its put futures were completed here (asyncio.wrap_future reads
        # each result on it), so its own end covers every put its tasks saw stored.
        seen = store._own_put_end()

        def covering() -> T:
            with store.reading_after(seen):
                return call(*args, **kwargs)

        return await asyncio.get_running_loop().run_in_executor(self._executor, covering)

    # put -------------------------------------------------------------------------------------
    async def put(self, message: Message) -> PutResult:
        """`MessageStore.put`, awaited: PUT_OK once the writer appended it (under SYNC_FLUSH
        once on disk). At the in-flight bound it waits for room (OS_PAGE_CACHE_BUSY at once
        with `put_fail_fast_when_in_flight_full`, as put_async)."""
        return await self._put(functools.partial(self.sync.put_async, message))

    async def put_batch(self, messages: Sequence[Message]) -> PutResult:
        """`MessageStore.put_batch`, awaited (one topic and queue, consecutive offsets)."""
        return await self._put(functools.partial(self.sync.put_batch_async, messages))

    async def _put(self, submit: Callable[[], concurrent.futures.Future[PutResult]]) -> PutResult:
        store = self.sync
        pipeline = store._puts
        pause = _ROOM_PAUSE_S[0]
        while True:
            with pipeline.not_waiting():
                future = submit()
            if not future.done():
                return await asyncio.wrap_future(future)
            result = future.result()
            if (result is not IN_FLIGHT_FULL and result is not BYTES_IN_FLIGHT_FULL) or pipeline.fails_fast:
                return result
            await asyncio.sleep(pause)  # no room yet: not sent, so a cancel here drops it
            pause = min(pause * 2, _ROOM_PAUSE_S[1])

    # reads -----------------------------------------------------------------------------------
    async def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        max_total_bytes: int | None = None,
        tags: str | None = None,
    ) -> GetResult:
        """`MessageStore.get` on the store's threads; it reflects this task's stored puts."""
        return await self._on_thread(self.sync.get, topic, queue_id, offset, max_count, max_total_bytes=max_total_bytes,
                                     tags=tags)  # fmt: skip

    async def query(
        self, topic: str, key: str, max_count: int | None = None, begin_ms: int = 0, end_ms: int = 2**63 - 1
    ) -> QueryResult:
        """`MessageStore.query` on the store's threads; it reflects this task's stored puts."""
        return await self._on_thread(self.sync.query, topic, key, max_count, begin_ms, end_ms)

    async def wait_for_messages(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """`MessageStore.wait_for_messages` (True once the queue holds `offset`, False after
        `timeout_s`; `math.inf` waits until it comes or the store closes), cancellable: it
        waits on a thread in slices of WAIT_SLICE_S, so a cancelled wait keeps no thread."""
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not timeout_s >= 0:
            raise ValueError(f"timeout_s must be a number >= 0, not {timeout_s!r}")
        deadline = math.inf if timeout_s == math.inf else time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if await self._on_thread(self.sync.wait_for_messages, topic, queue_id, offset, max(min(remaining, WAIT_SLICE_S), 0.0)):
                return True
            if remaining <= WAIT_SLICE_S:
                return False

    # flush and close ------------------------------------------------------------------------
    async def flush(self) -> None:
        """`MessageStore.flush` on the store's threads."""
        await self._on_thread(self.sync.flush)

    async def close(self) -> bool:
        """`MessageStore.close` on the store's threads; then the threads end."""
        try:
            return await self._on_thread(self.sync.close)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> AsyncMessageStore:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()


class _Opening:
    """What `open` returns: awaited, the store; or `async with`, opened and closed around the block."""

    __slots__ = ("_open", "_store")

    def __init__(self, open_store: Callable[[], MessageStore]) -> None:
        self._open = open_store
        self._store: AsyncMessageStore | None = None

    async def _opened(self) -> AsyncMessageStore:
        # A thread of its own, not the host's default executor: an open runs recovery, seconds
        # on a big store. Not a pool left with `with` either: cancelled (a timeout, a Ctrl-C),
        # its shutdown waited for the open on the event loop (1.6 s stalled, the timeout kept
        # 2.6 s), and the store it opened was nobody's, holding the lock (review 93 M3).
        job: concurrent.futures.Future[MessageStore] = concurrent.futures.Future()

        def run() -> None:
            if job.set_running_or_notify_cancel():
                try:
                    job.set_result(self._open())
                except BaseException as exc:  # the awaiting task's to raise
                    job.set_exception(exc)

        StoreThread(run, "mqstore-aio-open").start()
        try:
            store = await asyncio.wrap_future(job)
        except BaseException:
            job.add_done_callback(_close_unclaimed)  # an open still under way: closed once done
            raise
        return AsyncMessageStore(store)

    def __await__(self) -> Generator[Any, None, AsyncMessageStore]:
        return self._opened().__await__()

    async def __aenter__(self) -> AsyncMessageStore:
        self._store = await self._opened()
        return self._store

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._store is not None:
            await self._store.close()


def _close_unclaimed(job: concurrent.futures.Future[MessageStore]) -> None:
    """An open whose awaiting task was cancelled: the store it opened is closed (on a thread of
    its own: this may run on the event loop), so its lock is free again."""
    if job.cancelled() or job.exception() is not None:
        return
    store = job.result()
    try:
        StoreThread(store.close, "mqstore-aio-close-unclaimed").start()
    except RuntimeError:  # no thread now (the interpreter's end): the exit hook closes it
        pass


def open(path: str | os.PathLike[str], **settings: Unpack[StoreSettings]) -> _Opening:  # noqa: A001 (mqstore.aio.open)
    """`mqstore.open(path, **settings)` for asyncio: `await mqstore.aio.open(path)`, or
    `async with mqstore.aio.open(path) as store:`. The open runs off the event loop."""
    from .store import open_store  # the store imports the pipeline this module imports

    return _Opening(functools.partial(open_store, path, **settings))
