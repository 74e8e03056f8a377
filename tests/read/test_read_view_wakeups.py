"""The read view wakes a waiter only for the publications that can make its target true
(`await_view(..., wakes_on=...)`), and closing wakes every waiter."""

from __future__ import annotations

import threading
import time
from typing import Callable

import pytest

from mqstore.messages import QueueBounds
from mqstore.read_view import ANY_PUBLICATION, COMMITLOG, DISPATCHED, INDEX, QUEUES, ReadView, ReadViewPublisher

# A waiter waits far longer than a test joins it: one never woken fails the join, rather than
# returning the right view at its timeout (await_view looks once more then).
WAIT_S = 120.0
JOIN_S = 5.0
# Room, after each round of publications, for a waiter they woke to look at the view.
SETTLE_S = 0.002


class _Waiter:
    """A thread in `await_view`, counting how often it looked at the view. `started` is set
    at its second look, made once it is registered, right before it sleeps: a publication
    made after that releases its lock, asleep or about to be (no wake-up is lost)."""

    def __init__(self, publisher: ReadViewPublisher, covers: Callable[[ReadView], bool], wakes_on: int) -> None:
        self.looks = 0
        self.result: ReadView | None = None
        self.started = threading.Event()

        def counting(view: ReadView) -> bool:
            self.looks += 1
            if self.looks == 2:
                self.started.set()
            return covers(view)

        def run() -> None:
            self.result = publisher.await_view(counting, WAIT_S, wakes_on)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.started.wait(JOIN_S)

    def join(self) -> None:
        self.thread.join(JOIN_S)
        assert not self.thread.is_alive(), "never woken"


def _queue_bounds(end: int) -> QueueBounds:
    return QueueBounds(bounds={("T", 0): (0, end)}, dispatched_offset=end, complete=False)


def test_a_queue_waiter_sleeps_through_the_other_publications_and_wakes_on_its_own() -> None:
    publisher = ReadViewPublisher()
    waiter = _Waiter(publisher, lambda v: v.queues_written >= 100, QUEUES)
    for end in range(1, 21):  # a writer pass, a dispatch batch and an index batch each
        publisher.publish_commitlog(end)
        publisher.publish_dispatched(end)
        publisher.publish_index(("00000000000000000000",), end)
        time.sleep(SETTLE_S)  # a waiter these woke looks at the view meanwhile (one look each)
    assert waiter.looks == 2, "woken by publications that cannot change what it waits for"
    publisher.publish_queues(_queue_bounds(100))
    waiter.join()
    assert waiter.result is not None and waiter.result.queues_written == 100
    assert waiter.looks == 3


@pytest.mark.parametrize(
    ("wakes_on", "covers", "publish"),
    [
        (COMMITLOG, lambda v: v.readable_end >= 7, lambda p: p.publish_commitlog(7)),
        (DISPATCHED, lambda v: v.dispatched_end >= 7, lambda p: p.publish_dispatched(7)),
        (QUEUES, lambda v: v.queues_written >= 7, lambda p: p.publish_queues(_queue_bounds(7))),
        (INDEX, lambda v: v.indexed_end >= 7, lambda p: p.publish_index((), 7)),
        (QUEUES | INDEX, lambda v: v.indexed_end >= 7, lambda p: p.publish_index((), 7)),
        (ANY_PUBLICATION, lambda v: v.readable_end >= 7, lambda p: p.publish_commitlog(7)),
    ],
    ids=["commitlog", "dispatched", "queues", "index", "queues-or-index", "any"],
)
def test_each_publication_wakes_its_waiters(
    wakes_on: int, covers: Callable[[ReadView], bool], publish: Callable[[ReadViewPublisher], None]
) -> None:
    publisher = ReadViewPublisher()
    waiter = _Waiter(publisher, covers, wakes_on)
    publish(publisher)
    waiter.join()
    assert waiter.result is not None and covers(waiter.result)


@pytest.mark.parametrize("how", ["close", "quarantine"])
def test_closing_and_a_quarantine_wake_every_waiter_whatever_it_waits_on(how: str) -> None:
    publisher = ReadViewPublisher()
    waiters = [_Waiter(publisher, lambda v: v.quarantined != () and kind > 0, kind) for kind in (COMMITLOG, QUEUES, INDEX)]
    if how == "close":
        publisher.close()
    else:
        publisher.add_quarantined(((0, 10),))
    for waiter in waiters:
        waiter.join()
        assert waiter.looks == 3
        assert (waiter.result is None) if how == "close" else (waiter.result is not None)


def test_a_waiter_that_timed_out_leaves_no_count_and_the_next_of_its_kind_is_woken() -> None:
    publisher = ReadViewPublisher()
    assert publisher.await_view(lambda v: v.queues_written > 0, 0.01, QUEUES) is None
    assert len(publisher._waiting[QUEUES]) == 0  # else every QUEUES publication wakes nobody
    waiter = _Waiter(publisher, lambda v: v.queues_written > 0, QUEUES)
    assert len(publisher._waiting[QUEUES]) == 1
    publisher.publish_queues(_queue_bounds(1))
    waiter.join()
    assert waiter.result is not None
    assert len(publisher._waiting[QUEUES]) == 0


@pytest.mark.parametrize("wakes_on", [0, 16, QUEUES | 32, -1])
def test_a_waiter_must_name_publications_that_exist(wakes_on: int) -> None:
    # wakes_on=0 would not even be woken by close(): refused, like any unknown bit.
    with pytest.raises(ValueError, match="wakes_on"):
        ReadViewPublisher().await_view(lambda v: False, 1.0, wakes_on)
