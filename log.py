"""Structured logging for mqstore: `get_logger` everywhere, `configure_logging` only by the CLI.

Library code logs key/value events through structlog, but the events travel as ordinary
`logging` records on the "mqstore" logger tree. So an embedding application that configured
neither structlog nor logging sees nothing (a NullHandler, as libraries should), one that
configured `logging` gets our records through its own handlers, and structlog's global
configuration (the host's business) is never touched. `configure_logging` installs our own
handler on the "mqstore" logger: a console line for people or one JSON object per line.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Hashable
from typing import IO, Any, Final, Iterator, MutableMapping

import structlog

__all__ = ["configure_logging", "get_logger", "retrying", "ROOT_LOGGER_NAME", "RepeatedLog", "REPEAT_LOG_INTERVAL_MS",
           "PROCESS_REPEATS", "suppressed_fields", "error_repr"]  # fmt: skip

ROOT_LOGGER_NAME: Final = "mqstore"
# The key/values ride on the LogRecord under this one attribute, so a field called `name` or
# `msg` cannot collide with LogRecord's own attributes.
_RECORD_ATTR: Final = "mqstore_event"

logging.getLogger(ROOT_LOGGER_NAME).addHandler(logging.NullHandler())


def _to_stdlib(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """Last processor of a library logger: the event becomes the message, the rest an attribute."""
    event = event_dict.pop("event", "")
    exc_info = event_dict.pop("exc_info", None)
    stack_info = bool(event_dict.pop("stack_info", False))
    kwargs: dict[str, Any] = {"msg": event, "extra": {_RECORD_ATTR: dict(event_dict)}}
    if exc_info:
        kwargs["exc_info"] = exc_info
    if stack_info:
        kwargs["stack_info"] = True
    return kwargs


# Set (on one thread) while it retries what failed and was reported already: see `retrying`.
_RETRYING: Final[contextvars.ContextVar[bool]] = contextvars.ContextVar("mqstore_retrying", default=False)


@contextlib.contextmanager
def retrying() -> Iterator[None]:
    """Within: this thread's library events below CRITICAL are dropped. For an actor retrying,
    every tick, what failed and was reported once (a held ConsumeQueue: the storage layer's
    two ERROR lines a try were ~170k lines a day). The actor reports the wait itself, at its
    start, now and then while it lasts, and at its end."""
    token = _RETRYING.set(True)
    try:
        yield
    finally:
        _RETRYING.reset(token)


# A host mistake repeated at any rate is logged in full once, then this often per kind.
REPEAT_LOG_INTERVAL_MS: Final = 60_000
# Kinds remembered at most: host exception types and callback names are the host's, unbounded.
REPEAT_LOG_MAX_KINDS: Final = 1_000
_MANY_KINDS: Final = "(more kinds than a repeat log keeps)"
# New kinds of one family (one call site and status, a kind per topic) logged in full per
# interval: a caller making up a new bad topic per put logged a line per topic (review 84 F6:
# 1,000 lines a minute, for ever); past these, the family's others share one kind.
REPEAT_LOG_NEW_KINDS_PER_FAMILY: Final = 10
_OTHER_KINDS: Final = "(others of its family)"


class RepeatedLog:
    """Lines for a mistake a caller can repeat at any rate (review 58 F4: a put_and_forget of
    a bad topic in a loop logged 13k lines/s, a raising done-callback 16k, 200+ GB a day on a
    disk that is often the store's). Per kind (the call site and the error's type): the first
    occurrence is logged in full, then at most one line each `interval_ms`, which carries
    `suppressed`, the occurrences not logged since the kind's previous line. Thread-safe; time
    from `now_ms` (a store's ticker, so tests move it by hand)."""

    def __init__(self, now_ms: Callable[[], int], interval_ms: int = REPEAT_LOG_INTERVAL_MS,
                 max_kinds: int = REPEAT_LOG_MAX_KINDS) -> None:  # fmt: skip
        self.now_ms = now_ms
        self._interval_ms = interval_ms
        self._max_kinds = max_kinds
        self._lock = threading.Lock()
        self._kinds: dict[Hashable, list[int]] = {}  # kind -> [its last line's ms, suppressed since]
        self._families: dict[Hashable, list[int]] = {}  # family -> [its interval's start ms, new kinds in it]

    def admit(self, kind: Hashable, *, family: Hashable | None = None) -> int | None:
        """None: this occurrence is not logged (it is counted); else log it, adding the returned
        count of occurrences suppressed before it when that is not 0 (`suppressed_fields`).
        `family`: at most REPEAT_LOG_NEW_KINDS_PER_FAMILY new kinds of it are logged in full
        per interval; the others count as one kind, `(*family, "(others of its family)")`."""
        now = self.now_ms()
        with self._lock:
            state = self._kinds.get(kind)
            if state is None and family is not None:
                started = self._families.get(family)
                if started is None or now - started[0] >= self._interval_ms:
                    if started is None and len(self._families) >= self._max_kinds:
                        self._families.clear()  # (families are call sites: never this many)
                    started = self._families[family] = [now, 0]
                if started[1] >= REPEAT_LOG_NEW_KINDS_PER_FAMILY:
                    kind = (*family, _OTHER_KINDS) if isinstance(family, tuple) else (family, _OTHER_KINDS)
                    state = self._kinds.get(kind)
                else:
                    started[1] += 1
            if state is None:
                if len(self._kinds) >= self._max_kinds:
                    self._forget_quiet_kinds(now)
                if len(self._kinds) >= self._max_kinds:
                    kind = _MANY_KINDS
                    state = self._kinds.get(kind)
                if state is None:
                    self._kinds[kind] = [now, 0]
                    return 0
            if now - state[0] < self._interval_ms:
                state[1] += 1
                return None
            suppressed, state[0], state[1] = state[1], now, 0
            return suppressed

    def _forget_quiet_kinds(self, now: int) -> None:
        # A kind with nothing suppressed whose line is an interval old is logged in full again
        # anyway: forgetting it loses nothing.
        for kind in [k for k, (at, n) in self._kinds.items() if n == 0 and now - at >= self._interval_ms]:
            del self._kinds[kind]

    def say(self, log: Any, level: str, event: str, kind: Hashable, **fields: object) -> None:
        """`event` at `level` if `admit(kind)` lets it through, with the count suppressed
        before it: the first in full, then once an interval."""
        suppressed = self.admit(kind)
        if suppressed is not None:
            getattr(log, level)(event, **fields, **suppressed_fields(suppressed))

    def flush(self, log: Any) -> None:
        """Log the occurrences suppressed since each kind's last line (at the store's close:
        the last repeats of a fault that stopped are counted, not lost)."""
        with self._lock:
            pending = [(kind, state[1]) for kind, state in self._kinds.items() if state[1]]
            self._kinds.clear()
            self._families.clear()
        for kind, suppressed in pending:
            log.warning("repeats not logged", kind=_kind_text(kind), suppressed=suppressed)


def _kind_text(kind: Hashable) -> str:
    parts = kind if isinstance(kind, tuple) else (kind,)
    return " / ".join(part.__qualname__ if isinstance(part, type) else str(part) for part in parts)


def suppressed_fields(suppressed: int) -> dict[str, int]:
    """The fields `RepeatedLog.admit`'s count adds to a line: none for a first occurrence."""
    return {"suppressed": suppressed} if suppressed else {}


def error_repr(exc: BaseException) -> str:
    """`repr(exc)` for a log line, or its type's name if the host's exception's repr raises
    (the line must not end the thread that logs it)."""
    try:
        return repr(exc)
    except BaseException:  # a SystemExit from a repr too: out of a listener it reached pykka (review 95 L2)
        return f"<{type(exc).__qualname__} whose repr raised>"


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


# For the process's own host callbacks and answers, which belong to no one store (the shared
# listeners, a Reply to a stopped actor): real time. Looked up as `log.PROCESS_REPEATS` at
# each use, so a test can put one on a manual ticker.
PROCESS_REPEATS = RepeatedLog(_monotonic_ms)


def _new_process_repeats_in_a_forked_child() -> None:
    global PROCESS_REPEATS
    PROCESS_REPEATS = RepeatedLog(_monotonic_ms)  # its lock may be held by a parent's thread


os.register_at_fork(after_in_child=_new_process_repeats_in_a_forked_child)


def _drop_while_retrying(_logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    if method != "critical" and _RETRYING.get():
        raise structlog.DropEvent
    return event_dict


# filter_by_level first, so a disabled debug() costs one level check.
_LIBRARY_PROCESSORS: Final[list[Any]] = [
    structlog.stdlib.filter_by_level,
    _drop_while_retrying,
    structlog.contextvars.merge_contextvars,
    _to_stdlib,
]


# The stdlib loggers by name, each got once: `logging.getLogger` takes logging's module lock
# before its `try` on 3.11 and 3.12, and an exception raised into the caller's thread just then
# (a Ctrl-C during an open, which makes its loggers) left it held for good: every logging call
# of every thread hung (review 85 F2). The store's own names are got at import (`prepare_loggers`).
_STDLIB_LOGGERS: dict[str, logging.Logger] = {}


def prepare_loggers(*names: str) -> None:
    """Get the stdlib loggers of `names` now (an import, not a caller's open)."""
    for name in names:
        get_logger(name)


def get_logger(name: str, **bound: Any) -> structlog.stdlib.BoundLogger:
    """A logger on the "mqstore" tree with `bound` key/values attached to every event.

    `name` may be a module's `__name__` ("mqstore.storage.commitlog") or a short name ("commitlog").
    """
    if name != ROOT_LOGGER_NAME and not name.startswith(ROOT_LOGGER_NAME + "."):
        name = f"{ROOT_LOGGER_NAME}.{name}"
    stdlib_logger = _STDLIB_LOGGERS.get(name)
    if stdlib_logger is None:
        stdlib_logger = _STDLIB_LOGGERS[name] = logging.getLogger(name)
    logger: structlog.stdlib.BoundLogger = structlog.wrap_logger(
        stdlib_logger,
        processors=_LIBRARY_PROCESSORS,
        wrapper_class=structlog.stdlib.BoundLogger,
    )
    return logger.bind(**bound) if bound else logger


def _from_record(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Formatter side: put back the key/values a library logger attached to the record."""
    record: logging.LogRecord | None = event_dict.get("_record")
    extra = getattr(record, _RECORD_ATTR, None) if record is not None else None
    if extra:
        for key, value in extra.items():
            event_dict.setdefault(key, value)
    return event_dict


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler configure_logging installed, so calling it again replaces it."""


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """The "mqstore" logger's handlers, level and propagation as they were before the block:
    the command line configures its own, and a host calling it in-process keeps its own
    (review 96 L4: its stream, level and propagation were taken for good)."""
    root = logging.getLogger(ROOT_LOGGER_NAME)
    handlers, level, propagate = list(root.handlers), root.level, root.propagate
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        root.propagate = propagate


def configure_logging(level: str | int = "WARNING", json: bool = False, stream: IO[str] | None = None) -> None:
    """Send mqstore's events at `level` and above to `stream` (default: stderr), one per line.

    Only the "mqstore" logger is configured (it stops propagating, so no line is printed twice);
    the host's root logger and structlog's global configuration are left alone.
    """
    if isinstance(level, str):
        numeric = logging.getLevelName(level.upper())
        if not isinstance(numeric, int):
            raise ValueError(f"unknown log level {level!r}")
        level = numeric
    renderer: Any
    if json:
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
        # No locals in tracebacks: they would copy message bodies into the log.
        tracebacks = structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        )
        final: list[Any] = [tracebacks, renderer]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False, sort_keys=False)
        final = [renderer]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            _from_record,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
    )
    handler = _OurHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger(ROOT_LOGGER_NAME)
    for old in [h for h in root.handlers if isinstance(h, _OurHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
