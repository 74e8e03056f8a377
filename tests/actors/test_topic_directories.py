"""A topic new to the store gets consumequeue/<topic>/ from the ConsumeQueue actor before its
first put is taken (store._claim_topic_dir). Where the directory cannot be made, the put is
refused with the reason, and nothing the store took before or after is held up.

Before, such a put was PUT_OK and dispatch then waited at its record: every later put of every
topic stayed unreadable until the directory could be made. (The filesystems that refuse a
topic's name or give it another topic's directory: tests/crash/test_case_insensitive_fs.py.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import mqstore
from mqstore import Message
from mqstore.storage.status import PutMessageStatus

SETTINGS = dict(read_your_writes_timeout_ms=2000, max_message_size_bytes=64 * 1024)


def _bodies(store: mqstore.MessageStore, topic: str) -> list[bytes]:
    return [m.body for m in store.get(topic, 0, 0, 64).messages]


def test_a_file_where_a_new_topics_directory_goes_refuses_its_puts_until_it_is_gone(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s", **SETTINGS) as store:
        assert store.put(Message("t", b"before")).ok
        in_the_way = tmp_path / "s" / "consumequeue" / "stray"
        in_the_way.write_bytes(b"not a directory")
        refused = store.put(Message("stray", b"refused"))
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, refused
        assert "stray" in refused.detail and "File exists" in refused.detail
        assert store.put(Message("t", b"after")).ok
        assert _bodies(store, "t") == [b"before", b"after"]  # before: held behind "stray"
        in_the_way.unlink()
        taken = store.put(Message("stray", b"taken"))
        assert taken.ok, taken
        assert _bodies(store, "stray") == [b"taken"]


def test_a_consume_queue_directory_that_takes_no_entries_refuses_new_topics_only(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("the immutable attribute needs root and chattr")
    root = tmp_path / "s" / "consumequeue"
    with mqstore.open(tmp_path / "s", **SETTINGS) as store:
        assert store.put(Message("known", b"1")).ok
        made = subprocess.run(["chattr", "+i", str(root)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"chattr +i: {made.stderr.strip()}")
        try:
            refused = store.put(Message("fresh", b"refused"))
            assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE, refused
            assert "Operation not permitted" in refused.detail
            assert store.put(Message("known", b"2")).ok
            assert _bodies(store, "known") == [b"1", b"2"]
        finally:
            subprocess.run(["chattr", "-i", str(root)], check=True)
        assert store.put(Message("fresh", b"taken")).ok
        assert _bodies(store, "fresh") == [b"taken"]


def test_a_put_refused_for_what_it_holds_leaves_no_directory(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s", **SETTINGS) as store:
        assert store.put(Message("big", b"x" * 65 * 1024)).status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.put(Message("fine", b"x")).ok
    assert sorted(os.listdir(tmp_path / "s" / "consumequeue")) == ["fine"]


def test_a_topic_is_claimed_once_not_at_every_put(tmp_path: Path) -> None:
    with mqstore.open(tmp_path / "s", **SETTINGS) as store:
        asked: list[str] = []
        claim = store._encoder._claim_topic
        assert claim is not None

        def counting(topic: str) -> object:
            asked.append(topic)
            return claim(topic)

        store._encoder._claim_topic = counting  # type: ignore[assignment]
        for i in range(50):
            assert store.put(Message("a", b"%d" % i)).ok
            assert store.put_batch([Message("b", b"%d" % i)] * 2).ok
            assert store.put_async(Message("c", b"%d" % i)).result(timeout=30).ok
        assert sorted(asked) == ["a", "b", "c"]
