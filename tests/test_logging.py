"""mqstore.log: quiet unless configured, one key/value event per line, JSON on request."""

from __future__ import annotations

import io
import json
import logging
import threading
from pathlib import Path
from collections.abc import Iterator

import pytest

from mqstore.log import REPEAT_LOG_INTERVAL_MS, ROOT_LOGGER_NAME, RepeatedLog, configure_logging, error_repr, get_logger
from mqstore.ticker import ManualTicker


@pytest.fixture(autouse=True)
def restore_mqstore_logger() -> Iterator[None]:
    root = logging.getLogger(ROOT_LOGGER_NAME)
    saved = (list(root.handlers), root.level, root.propagate)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    root.propagate = saved[2]


def test_json_mode_emits_one_parseable_object_per_line_with_bound_and_call_values() -> None:
    out = io.StringIO()
    configure_logging("INFO", json=True, stream=out)
    log = get_logger("storage.commitlog", segment="00000000000000000000")
    log.info("segment rolled", next_offset=8192)
    log.warning("disk almost full", used_ratio=0.91, name="collides-with-LogRecord.name")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["event"] == "segment rolled"
    assert first["segment"] == "00000000000000000000"
    assert first["next_offset"] == 8192
    assert first["level"] == "info"
    assert first["logger"] == "mqstore.storage.commitlog"
    assert "timestamp" in first
    assert second["used_ratio"] == 0.91 and second["name"] == "collides-with-LogRecord.name"


def test_json_mode_renders_exceptions_as_data() -> None:
    out = io.StringIO()
    configure_logging("ERROR", json=True, stream=out)
    try:
        raise OSError(28, "No space left on device")
    except OSError:
        get_logger("flush").exception("flush failed", offset=4096)
    entry = json.loads(out.getvalue())
    assert entry["offset"] == 4096
    assert entry["exception"][0]["exc_type"] == "OSError"


def test_level_filters_and_default_level_is_warning() -> None:
    out = io.StringIO()
    configure_logging(json=True, stream=out)
    log = get_logger("mqstore.cleaner")
    log.info("not shown")
    log.warning("shown")
    assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["shown"]


def test_console_mode_is_one_line_with_key_values() -> None:
    out = io.StringIO()
    configure_logging(logging.DEBUG, stream=out)
    get_logger("reput", topic="abc").debug("dispatched", queue_offset=3)
    text = out.getvalue()
    assert text.count("\n") == 1
    assert "dispatched" in text and "topic=abc" in text and "queue_offset=3" in text


def test_configuring_twice_replaces_the_handler_instead_of_doubling_lines() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("INFO", stream=first)
    configure_logging("INFO", stream=second)
    get_logger("x").info("once")
    assert first.getvalue() == ""
    assert second.getvalue().count("once") == 1


def test_unconfigured_library_logging_goes_only_through_the_hosts_logging(caplog: pytest.LogCaptureFixture) -> None:
    # The host's own logging configuration (here pytest's capture) receives plain records.
    root = logging.getLogger(ROOT_LOGGER_NAME)
    # Unconfigured: in-process CLI tests earlier in the session may have configured it (the
    # autouse fixture puts their handlers back afterwards).
    root.handlers[:] = [h for h in root.handlers if isinstance(h, logging.NullHandler)]
    root.propagate = True
    root.setLevel(logging.NOTSET)
    host_root_handlers = list(logging.getLogger().handlers)
    with caplog.at_level(logging.WARNING, logger=ROOT_LOGGER_NAME):
        get_logger("allocate").warning("slow allocation", waited_ms=5001)
    assert [r.getMessage() for r in caplog.records] == ["slow allocation"]
    assert caplog.records[0].mqstore_event == {"waited_ms": 5001}
    assert logging.getLogger().handlers == host_root_handlers  # get_logger touched nothing global


def test_unknown_level_is_rejected() -> None:
    with pytest.raises(ValueError, match="LOUD"):
        configure_logging("LOUD")


# Review 58 F4: a host repeating one mistake logged a line per call (13k-16k lines/s).


def test_a_repeated_kind_is_logged_once_then_once_an_interval_with_the_count_suppressed() -> None:
    ticker = ManualTicker()
    repeats = RepeatedLog(ticker.now_ms)
    assert repeats.admit(("refused", "MESSAGE_ILLEGAL")) == 0  # the first: in full
    assert [repeats.admit(("refused", "MESSAGE_ILLEGAL")) for _ in range(1000)] == [None] * 1000
    assert repeats.admit(("done-callback raised", ValueError)) == 0  # another kind: its own first line
    ticker.advance(REPEAT_LOG_INTERVAL_MS - 1)
    assert repeats.admit(("refused", "MESSAGE_ILLEGAL")) is None
    ticker.advance(1)
    assert repeats.admit(("refused", "MESSAGE_ILLEGAL")) == 1001  # the interval's line: how many were not logged
    assert repeats.admit(("refused", "MESSAGE_ILLEGAL")) is None
    ticker.advance(REPEAT_LOG_INTERVAL_MS)
    assert repeats.admit(("refused", "MESSAGE_ILLEGAL")) == 1


def test_repeats_not_logged_are_counted_at_the_flush_and_kinds_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    ticker = ManualTicker()
    repeats = RepeatedLog(ticker.now_ms, max_kinds=3)
    for kind in ("a", "b", "c"):
        assert repeats.admit(kind) == 0
    assert repeats.admit("b") is None
    # A 4th kind while 3 are kept: one table entry for all further kinds, still limited.
    assert [repeats.admit(f"host type {i}") for i in range(100)] == [0] + [None] * 99
    ticker.advance(REPEAT_LOG_INTERVAL_MS)
    assert repeats.admit("d") == 0  # "a" and "c" had nothing suppressed: forgotten to make room
    # Full again: under the many-kinds entry, whose line an interval on carries its count.
    assert repeats.admit(("done-callback raised", ValueError)) == 99
    assert repeats.admit(("done-callback raised", ValueError)) is None
    assert repeats.admit("d") is None
    with caplog.at_level(logging.WARNING, logger=ROOT_LOGGER_NAME):
        repeats.flush(get_logger("puts"))
        repeats.flush(get_logger("puts"))  # counted once
    assert sorted((r.mqstore_event["kind"], r.mqstore_event["suppressed"]) for r in caplog.records) == [
        ("(more kinds than a repeat log keeps)", 1), ("b", 1), ("d", 1)]  # fmt: skip


def test_error_repr_of_an_exception_whose_repr_raises_names_its_type() -> None:
    class Odd(Exception):
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert error_repr(ValueError("x")) == "ValueError('x')"
    assert error_repr(Odd()) == "<test_error_repr_of_an_exception_whose_repr_raises_names_its_type.<locals>.Odd whose repr raised>"


def test_a_family_logs_ten_new_kinds_an_interval_in_full_and_its_others_as_one(caplog: pytest.LogCaptureFixture) -> None:
    """Review 84 F6: a kind per topic (so one topic's refusal does not hide another's, review
    59 L2) let a caller that made up a new bad topic per put log a line per topic, 1,000 a
    minute for ever. A family's first REPEAT_LOG_NEW_KINDS_PER_FAMILY new kinds an interval
    are its own; the others share one kind, limited and counted like any."""
    from mqstore.log import REPEAT_LOG_NEW_KINDS_PER_FAMILY

    ticker = ManualTicker()
    repeats = RepeatedLog(ticker.now_ms)
    family = ("refused", "MESSAGE_ILLEGAL")
    first = [repeats.admit((*family, f"topic {i}"), family=family) for i in range(100)]
    assert first == [0] * REPEAT_LOG_NEW_KINDS_PER_FAMILY + [0] + [None] * (99 - REPEAT_LOG_NEW_KINDS_PER_FAMILY)
    assert repeats.admit((*family, "topic 3"), family=family) is None  # one of the ten: its own kind
    assert repeats.admit(("refused", "TOPIC_TOO_LONG", "x"), family=("refused", "TOPIC_TOO_LONG")) == 0  # another family
    ticker.advance(REPEAT_LOG_INTERVAL_MS)
    # A new interval: new kinds in full again, and the others' line carries their count.
    assert repeats.admit((*family, "topic 500"), family=family) == 0
    with caplog.at_level(logging.WARNING, logger=ROOT_LOGGER_NAME):
        repeats.flush(get_logger("puts"))
    assert sorted((r.mqstore_event["kind"], r.mqstore_event["suppressed"]) for r in caplog.records) == [
        ("refused / MESSAGE_ILLEGAL / (others of its family)", 89), ("refused / MESSAGE_ILLEGAL / topic 3", 1)]  # fmt: skip


def test_an_open_and_close_get_no_stdlib_logger_in_the_callers_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 85 F2: `logging.getLogger` takes logging's module lock before its `try` (3.11,
    3.12): a Ctrl-C as an open made its loggers left that lock held, and every logging call
    of every thread hung. The store's loggers are got at import; an open gets none."""
    import mqstore

    caller = threading.get_ident()
    got: list[str] = []
    real = logging.getLogger

    def recording(name: str | None = None) -> logging.Logger:
        if threading.get_ident() == caller:
            got.append(str(name))
        return real(name)

    monkeypatch.setattr(logging, "getLogger", recording)
    store = mqstore.open(tmp_path / "s")
    assert store.put(mqstore.Message(topic="t", body=b"x")).ok
    store.close()
    assert [name for name in got if name.startswith("mqstore")] == []
