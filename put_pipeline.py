"""Pipelined puts: `put_async` futures for threads, and the actor client for pykka actors.

A put is encoded in the caller's thread and told to the writer, which drains every put
waiting in one pass (actors.commitlog_writer); the caller does not wait for the answer. A
thread gets a `concurrent.futures.Future[PutResult]`, completed on this store's completion
thread (never the writer's: a done-callback is host code, and the writer must not run it);
an actor gets `Replied(correlation_id, PutResult)` in its inbox, or nothing (fire and forget:
failures go to the stats and the log).

At most `max_puts_in_flight` puts per store are told and not yet answered; beyond it a put
blocks until one is answered, or with `put_fail_fast_when_in_flight_full` is answered
OS_PAGE_CACHE_BUSY at once. Failures are statuses (SERVICE_NOT_AVAILABLE when the writer
crashed or the store closed), never exceptions set on the future.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Any, Callable, Hashable, Sequence

import pykka

from .log import get_logger
from .messages import Message, PutResult, Replied, Reply
from .storage.status import PutMessageStatus

if TYPE_CHECKING:
    from .store import MessageStore

__all__ = ["PutPipeline", "ActorClient"]

IN_FLIGHT_FULL = PutResult(status=PutMessageStatus.OS_PAGE_CACHE_BUSY, detail="max_puts_in_flight reached")

# (future or None for fire-and-forget, answer, topic, started_ns); None stops the thread.
_Completion = tuple["Future[PutResult] | None", Any, str, int]


def as_put_result(answer: Any) -> PutResult:
    """The writer's answer as a PutResult: a failure (the writer crashed or stopped holding
    the put) is SERVICE_NOT_AVAILABLE, an operating error like any other."""
    if isinstance(answer, PutResult):
        return answer
    return PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail=str(answer) or type(answer).__name__)


class _ToCompletion:
    """A future's Reply callback (in the writer's thread): queue the answer for the completion
    thread. One slotted object rather than a closure and its cells: fewer objects per put for
    the garbage collector, whose passes were a third of put_async's cost in the caller."""

    __slots__ = ("_completions", "_future", "_topic", "_started")

    def __init__(
        self, completions: queue.SimpleQueue[_Completion | None], future: Future[PutResult], topic: str, started: int
    ) -> None:
        self._completions = completions
        self._future = future
        self._topic = topic
        self._started = started

    def __call__(self, answer: Any) -> None:
        self._completions.put((self._future, answer, self._topic, self._started))


class PutPipeline:
    """One per store: the in-flight bound, the futures handed out, the completion thread."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store
        # Free in-flight slots, under a raw lock (threading.Semaphore costs ~1 us of Python a
        # put); the condition on that lock wakes a blocked put_async.
        self._free_slots = store.config.max_puts_in_flight
        self._slot_lock = threading.Lock()
        self._slot_freed = threading.Condition(self._slot_lock)
        self._slot_waiters = 0
        self._fail_fast = store.config.put_fail_fast_when_in_flight_full
        # Futures handed out and not completed, so flush() can wait for them. set.add/discard
        # and copy() are single C calls under the GIL.
        self._pending: set[Future[PutResult]] = set()
        self._completions: queue.SimpleQueue[_Completion | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._closed = False
        self.log = get_logger("mqstore.puts", store=store.config.store_path_root_dir)

    # threads ---------------------------------------------------------------------------------
    def put_async(self, messages: Sequence[Message], *, batch: bool) -> Future[PutResult]:
        future: Future[PutResult] = Future()
        future.set_running_or_notify_cancel()  # handed to the writer: it cannot be cancelled
        topic = messages[0].topic if messages else ""
        self._pending.add(future)
        try:
            reply = self._submit(messages, batch, topic, _ToCompletion(self._completions, future, topic, time.monotonic_ns()))
        except BaseException:  # bad input (TypeError, ValueError): nothing was handed out
            self._pending.discard(future)
            raise
        if isinstance(reply, PutResult):
            self._pending.discard(future)
            future.set_result(reply)  # refused before the writer, in the caller's thread
            return future
        # Read-your-writes: once this thread saw the future done, its reads cover the put.
        self._store._local.last_async_put = future
        if self._closed:
            self._complete_closed()  # closed meanwhile: no completion thread to do it
        return future

    def _submit(
        self, messages: Sequence[Message], batch: bool, topic: str, on_answer: Callable[[Any], None]
    ) -> PutResult | Reply:
        """Encode here, take an in-flight slot, tell the writer. A PutResult if refused before
        the writer (no slot taken); else the Reply whose callback `on_answer` gets the writer's
        answer in the writer's thread, and must give the slot back (for a future, once the
        completion thread took the answer: a slow done-callback holds the slots, so the
        completion queue stays bounded too)."""
        store = self._store
        started = time.monotonic_ns()
        checked = store._encode(messages, batch)
        if isinstance(checked, PutResult):
            return checked
        if not self._take_slot():
            store.stats_service.record_put(topic, IN_FLIGHT_FULL, time.monotonic_ns() - started)
            return IN_FLIGHT_FULL
        self._ensure_thread()
        reply = Reply(callback=on_answer, store_internal_callback=True)  # the store's own, cheap
        store._tell_writer(messages, batch, checked, reply, keep_gil=True)  # a writer that is down: answered here
        return reply

    def _take_slot(self) -> bool:
        with self._slot_lock:
            if self._free_slots > 0:
                self._free_slots -= 1
                return True
            # The completion thread (a done-callback putting again) must never block: only
            # it gives slots back to futures.
            if self._fail_fast or threading.current_thread() is self._thread:
                return False
            deadline = time.monotonic() + self._store._reply_timeout_s
            self._slot_waiters += 1
            try:
                while self._free_slots <= 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._slot_freed.wait(remaining)
            finally:
                self._slot_waiters -= 1
            self._free_slots -= 1
            return True

    def _release_slot(self) -> None:
        with self._slot_lock:
            self._free_slots += 1
            if self._slot_waiters:
                self._slot_freed.notify()

    def _ensure_thread(self) -> bool:
        if self._thread is not None:
            return True
        with self._thread_lock:
            if self._closed:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._complete_loop, name="mqstore-put-completions", daemon=True)
                self._thread.start()
        return True

    def _complete_loop(self) -> None:
        get = self._completions.get
        record = self._store.stats_service.record_put
        pending = self._pending
        release = self._release_slot
        while (item := get()) is not None:
            future, answer, topic, started = item
            release()
            result = as_put_result(answer)
            try:
                record(topic, result, time.monotonic_ns() - started)
            except Exception as exc:  # the figures are not worth a future that never completes
                self.log.error("recording a put in the stats failed", error=repr(exc))
            if future is None:  # fire and forget
                if not result.stored:
                    self.log.warning("fire-and-forget put failed", topic=topic, status=result.status.name, detail=result.detail)
                continue
            pending.discard(future)
            future.set_result(result)  # its done-callbacks run here, in this thread

    # actors ----------------------------------------------------------------------------------
    def tell_put(
        self, messages: Sequence[Message], *, batch: bool, sender: pykka.ActorRef[Any] | None, correlation_id: Hashable
    ) -> bool:
        """For ActorClient: the answer goes to `sender` as Replied(correlation_id, PutResult)
        (told from the writer's thread: a tell only enqueues), or with no sender to the stats
        and the log. False if the put was refused before reaching the writer."""
        topic = messages[0].topic if messages else ""
        started = time.monotonic_ns()
        if sender is None:
            completions = self._completions

            def on_answer(answer: Any) -> None:
                completions.put((None, answer, topic, started))

        else:
            record = self._store.stats_service.record_put
            release = self._release_slot

            def on_answer(answer: Any) -> None:
                release()
                result = as_put_result(answer)
                record(topic, result, time.monotonic_ns() - started)
                try:
                    sender.tell(Replied(correlation_id=correlation_id, answer=result))
                except pykka.ActorDeadError:
                    pass  # the asker is gone; the put itself stands

        reply = self._submit(messages, batch, topic, on_answer)
        if isinstance(reply, PutResult):  # refused here: no slot was taken, none to give back
            if sender is not None:
                sender.tell(Replied(correlation_id=correlation_id, answer=reply))
            elif not reply.stored:
                self.log.warning("fire-and-forget put refused", topic=topic, status=reply.status.name, detail=reply.detail)
            return False
        return True

    # flush and close -------------------------------------------------------------------------
    def wait_handed_out(self, timeout_s: float) -> None:
        """Wait until every future handed out before this call is done (store.flush()).
        From a done-callback (the completion thread) it cannot wait for the futures that
        thread has still to complete: it waits for none."""
        if threading.current_thread() is self._thread:
            return
        handed_out = self._pending.copy()
        if handed_out:
            wait(handed_out, timeout=timeout_s)

    def close(self) -> None:
        """After the writer stopped (its queued puts failed into the completion queue):
        complete everything still pending, stop the completion thread."""
        with self._thread_lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._completions.put(None)
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        self._complete_closed()

    def _complete_closed(self) -> None:
        """No completion thread (closed): complete what is queued and pending here."""
        while True:
            try:
                item = self._completions.get_nowait()
            except queue.Empty:
                break
            if item is None:
                continue
            self._release_slot()
            if item[0] is not None:
                self._pending.discard(item[0])
                if not item[0].done():
                    item[0].set_result(as_put_result(item[1]))
        closed = PutResult(status=PutMessageStatus.SERVICE_NOT_AVAILABLE, detail="store closed")
        for future in self._pending.copy():
            self._pending.discard(future)
            if not future.done():
                future.set_result(closed)


class ActorClient:
    """Puts for a pykka actor, straight to the writer (no gateway hop): the message is encoded
    in the sending actor's own thread, and the answer arrives in its inbox as
    `Replied(correlation_id, PutResult)`. Keep a window of puts in flight (send the next
    when an answer arrives) rather than one at a time: the writer takes every put waiting in
    one pass. `put_and_forget` asks no answer; a failure goes to the store's stats and log.

    In the sending actor: `self.client = store.actor_client(self.actor_ref)`. Methods return
    False if the put was refused before reaching the writer (its Replied is already sent).
    The puts count against the store's `max_puts_in_flight`: when it is reached the sending
    actor's thread blocks until an answer frees a slot, or with
    `put_fail_fast_when_in_flight_full` gets OS_PAGE_CACHE_BUSY at once (a window keeps an
    actor well below it). The gateway's `Put` (told to `store.actor_ref`) still works, one
    thread hop more, and is not counted."""

    __slots__ = ("_pipeline", "_sender")

    def __init__(self, pipeline: PutPipeline, sender: pykka.ActorRef[Any]) -> None:
        if not isinstance(sender, pykka.ActorRef):
            raise TypeError(f"sender must be a pykka ActorRef, not {type(sender).__name__}")
        self._pipeline = pipeline
        self._sender = sender

    def put(self, message: Message, correlation_id: Hashable = None) -> bool:
        return self._pipeline.tell_put((message,), batch=False, sender=self._sender, correlation_id=correlation_id)

    def put_batch(self, messages: Sequence[Message], correlation_id: Hashable = None) -> bool:
        """One topic and queue, consecutive queue offsets, one answer (the store's put_batch)."""
        return self._pipeline.tell_put(tuple(messages), batch=True, sender=self._sender, correlation_id=correlation_id)

    def put_and_forget(self, message: Message) -> bool:
        return self._pipeline.tell_put((message,), batch=False, sender=None, correlation_id=None)
