"""PutEncoder: the checks and bytes of a put, the same with and without the C encoder, and the
same on a topic's first put and on every later one (its validated topic is kept)."""

from __future__ import annotations

import pytest

from mqstore import Message
from mqstore.storage import codec, speedups
from mqstore.storage.put_encoding import EncodedBatch, PutEncoder, PutRefused
from mqstore.storage.status import PutMessageStatus

NOW = 1_700_000_000_123
STORE_HOST = codec.HostAddress("10.1.2.3", 10911)


def _encode(messages: list[Message], batch: bool = False, max_size: int = 4 << 20) -> EncodedBatch | PutRefused:
    return PutEncoder(STORE_HOST, max_size).encode(messages, batch, NOW)


@pytest.mark.parametrize("batch", [False, True])
def test_every_put_of_a_topic_encodes_as_the_pure_python_path(batch: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    messages = [Message(topic="Orders", body=b"x" * n, queue_id=2, tags="t", keys=[f"k{n}"]) for n in range(3)]
    puts = [messages] if batch else [[m] for m in messages]
    encoder = PutEncoder(STORE_HOST, 4 << 20)
    first, again = [encoder.encode(p, batch, NOW) for p in puts], [encoder.encode(p, batch, NOW) for p in puts]
    monkeypatch.setattr(speedups, "native", None)
    pure = [PutEncoder(STORE_HOST, 4 << 20).encode(p, batch, NOW) for p in puts]
    assert all(isinstance(p, EncodedBatch) for p in pure)
    assert first == again == pure


def test_several_messages_are_a_batch_or_nothing() -> None:
    """Review 131 F1: a put that is not a batch is labelled by its first message and given one
    queue offset; more records in it were appended at another queue's offsets."""
    two = [Message(topic="A", body=b"a"), Message(topic="B", queue_id=1, body=b"b")]
    with pytest.raises(ValueError, match="not a batch"):
        _encode(two, batch=False)


def test_a_refused_topic_is_refused_on_every_put_and_a_valid_one_stays_valid() -> None:
    encoder = PutEncoder(STORE_HOST, 4 << 20)
    for topic in ("bad topic", "", "SCHEDULE_TOPIC_XXXX", "x" * 200, "bad topic"):
        refused = encoder.encode([Message(topic=topic, body=b"x")], False, NOW)
        assert isinstance(refused, PutRefused) and refused.status is PutMessageStatus.MESSAGE_ILLEGAL, topic
    for _ in range(2):
        assert isinstance(encoder.encode([Message(topic="Fine", body=b"x")], False, NOW), EncodedBatch)


def test_a_batch_over_the_size_limit_is_refused_on_the_c_path_and_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = [Message(topic="Orders", body=b"x" * 100) for _ in range(4)]
    single_size = len(_encode(messages[:1]).records[0])  # type: ignore[union-attr]
    limit = single_size * 3
    assert all(isinstance(_encode([m], batch=False, max_size=limit), EncodedBatch) for m in messages)  # each fits alone
    for native in (speedups.native, None):
        monkeypatch.setattr(speedups, "native", native)
        refused = _encode(messages, batch=True, max_size=limit)
        assert isinstance(refused, PutRefused) and refused.detail.startswith("batch of"), native
