"""The store-lifetime watch of SYNC_FLUSH's group commits (actors/group_commits.py): which it
answers and when, with the clock passed in."""

from __future__ import annotations

import sys
import threading

from mqstore import PutMessageStatus, PutResult
from mqstore.actors.group_commits import GROUP_COMMIT_EXPIRY_GRACE_NS, GroupCommitWatch
from mqstore.messages import GroupCommitRequest, Reply


def _request(deadline_ns: int, answers: list[tuple[int, object]]) -> GroupCommitRequest:
    result = PutResult(status=PutMessageStatus.PUT_OK, commitlog_offset=deadline_ns, wrote_bytes=10)
    reply: Reply[PutResult] = Reply(callback=lambda a: answers.append((deadline_ns, a)), store_internal_callback=True)
    return GroupCommitRequest(next_offset=deadline_ns + 10, result=result, reply=reply, deadline_ns=deadline_ns, appended_ns=0)


def test_only_the_unanswered_past_their_deadline_and_grace_are_answered_each_once() -> None:
    answers: list[tuple[int, object]] = []
    watch = GroupCommitWatch()
    first, second, third = (_request(d, answers) for d in (100, 200, 300))
    for request in (first, second, third):
        watch.add(request)
    first.reply.send(first.result)  # the flush actor answered it
    assert watch.expire(now_ns=199 + GROUP_COMMIT_EXPIRY_GRACE_NS) == 0
    assert len(watch) == 2  # the answered one left from the front
    assert watch.expire(now_ns=200 + GROUP_COMMIT_EXPIRY_GRACE_NS) == 1
    assert [(d, a.status, a.stored) for d, a in answers[1:]] == [(200, PutMessageStatus.FLUSH_DISK_TIMEOUT, True)]
    second.reply.send(second.result)  # the flush actor's late answer: the caller already has one
    assert watch.answer_all("the store stopped") == 1
    assert [(d, a.status, a.detail) for d, a in answers[1:]] == [
        (200, PutMessageStatus.FLUSH_DISK_TIMEOUT, "flush too slow (stalled)"),
        (300, PutMessageStatus.FLUSH_DISK_TIMEOUT, "the store stopped"),
    ]
    assert len(watch) == 0 and [d for d, _ in answers] == [100, 200, 300]


def test_drop_answered_keeps_an_unanswered_front_and_what_follows_it() -> None:
    answers: list[tuple[int, object]] = []
    watch = GroupCommitWatch()
    requests = [_request(d, answers) for d in (1, 2, 3)]
    for request in requests:
        watch.add(request)
    requests[2].reply.send(requests[2].result)
    watch.drop_answered()
    assert len(watch) == 3  # (the front is unanswered: nothing behind it is looked at)
    requests[0].reply.send(requests[0].result)
    watch.drop_answered()
    assert len(watch) == 2 and answers == [(3, requests[2].result), (1, requests[0].result)]


def test_answer_all_while_a_writer_adds_answers_every_request_once() -> None:
    """A give-up empties the watch while the writer may still add: from the front, never
    iterated (a deque changed during an iteration raises)."""
    answers: list[tuple[int, object]] = []
    watch = GroupCommitWatch()
    stop = threading.Event()
    added: list[GroupCommitRequest] = []

    def writer() -> None:
        n = 0
        while not stop.is_set():
            request = _request(n, answers)
            added.append(request)
            watch.add(request)
            n += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the two threads interleave within the watch's own loops
    try:
        thread = threading.Thread(target=writer)
        thread.start()
        answered = sum(watch.answer_all("stopped") for _ in range(2000))
        stop.set()
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    answered += watch.answer_all("stopped")
    assert answered == len(added) == len(answers) == len({d for d, _ in answers})
