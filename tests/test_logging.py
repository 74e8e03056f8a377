"""mqstore.log: quiet unless configured, one key/value event per line, JSON on request."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from mqstore.log import ROOT_LOGGER_NAME, configure_logging, get_logger


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
