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
import sys
from typing import IO, Any, Final, Iterator, MutableMapping

import structlog

__all__ = ["configure_logging", "get_logger", "retrying", "ROOT_LOGGER_NAME"]

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


def get_logger(name: str, **bound: Any) -> structlog.stdlib.BoundLogger:
    """A logger on the "mqstore" tree with `bound` key/values attached to every event.

    `name` may be a module's `__name__` ("mqstore.storage.commitlog") or a short name ("commitlog").
    """
    if name != ROOT_LOGGER_NAME and not name.startswith(ROOT_LOGGER_NAME + "."):
        name = f"{ROOT_LOGGER_NAME}.{name}"
    logger: structlog.stdlib.BoundLogger = structlog.wrap_logger(
        logging.getLogger(name),
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
