"""A msgpack document sealed with a CRC-32 of its body: the format of mqstore's own small files
(the queue ledger, the index progress), each written whole and read back exactly or refused,
a flipped bit included. No RocketMQ version reads them."""

from __future__ import annotations

import zlib
from typing import Any, Container

import msgpack

__all__ = ["seal", "unseal"]


def seal(kind: str, version: int, field: str, content: object) -> bytes:
    """The file's bytes: {"format": kind, "version": version, field: packed content, "crc32": ...}."""
    body = msgpack.packb(content, use_bin_type=True)
    document: bytes = msgpack.packb(
        {"format": kind, "version": version, field: body, "crc32": zlib.crc32(body)}, use_bin_type=True
    )
    return document


def unseal(data: bytes, kind: str, versions: Container[int], field: str, error: type[ValueError]) -> tuple[int, Any]:
    """(version, content) of a document `seal` wrote; `error` for anything else."""
    try:
        document = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise error(f"not msgpack: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != kind:
        raise error(f"not a {kind} file")
    version = document.get("version")
    if type(version) is not int or version not in versions:
        raise error(f"{kind} version {version!r}, this mqstore reads {versions!r}")
    body, crc = document.get(field), document.get("crc32")
    if not isinstance(body, bytes) or crc != zlib.crc32(body):
        raise error("checksum mismatch")
    try:
        return version, msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise error(f"{field} not msgpack: {exc}") from exc
