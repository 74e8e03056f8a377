"""A msgpack document sealed with a CRC-32 of its body: the format of mqstore's own small files
(the queue ledger, the index progress), each written whole and read back exactly or refused,
a flipped bit included. No RocketMQ version reads them.

A document of the right format and a version newer than this code reads is not damage: a newer
mqstore wrote it, and the guarantees it carries (the ledger's reserved queue offsets) hold only
while it is read. `unseal` raises UnknownVersionError for it, which the store refuses at open
and the tools report; the file stays where it is (review 62 H2)."""

from __future__ import annotations

import zlib
from typing import Any

import msgpack

from mqstore.storage.lockfiles import StoreDirectoryError

__all__ = ["UnknownVersionError", "seal", "unseal"]


class UnknownVersionError(StoreDirectoryError):
    """A sealed document of `kind` at `version`, newer than the `readable` versions this code
    reads: written by a newer mqstore. Not a ValueError, so no caller takes it for damage and
    sets the file aside; a StoreDirectoryError, so an open and the tools refuse with it."""

    def __init__(self, kind: str, version: int, readable: tuple[int, ...], path: str | None = None) -> None:
        self.kind, self.version, self.readable, self.path = kind, version, readable, path
        reads = f"versions {min(readable)}-{max(readable)}" if len(readable) > 1 else f"version {readable[0]}"
        super().__init__(
            f"{path or 'a ' + kind + ' file'} is {kind} version {version}, written by a newer mqstore; this mqstore "
            f"reads {reads}. Refused, the file left in place: open the store with the mqstore that wrote it "
            "(this one would not keep what the file records). If none newer ran on this store, the version field "
            "is damaged: move the file aside, and the open goes on without it"
        )

    def at(self, path: str) -> UnknownVersionError:
        """The same error, naming the file."""
        return UnknownVersionError(self.kind, self.version, self.readable, path)


def seal(kind: str, version: int, field: str, content: object) -> bytes:
    """The file's bytes: {"format": kind, "version": version, field: packed content, "crc32": ...}."""
    body = msgpack.packb(content, use_bin_type=True)
    document: bytes = msgpack.packb(
        {"format": kind, "version": version, field: body, "crc32": zlib.crc32(body)}, use_bin_type=True
    )
    return document


def unseal(data: bytes, kind: str, versions: tuple[int, ...], field: str, error: type[ValueError]) -> tuple[int, Any]:
    """(version, content) of a document `seal` wrote; UnknownVersionError for one of `kind`
    whose version is above `versions` (its body is not checked: a newer version may lay it
    out otherwise; the CRC does not cover the version, so a flipped bit that raises it is
    refused this way too, never read); `error` for anything else."""
    try:
        document = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise error(f"not msgpack: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != kind:
        raise error(f"not a {kind} file")
    version = document.get("version")
    if type(version) is int and version > max(versions):
        raise UnknownVersionError(kind, version, versions)
    if type(version) is not int or version not in versions:
        raise error(f"{kind} version {version!r}, this mqstore reads {versions!r}")
    body, crc = document.get(field), document.get("crc32")
    if not isinstance(body, bytes) or crc != zlib.crc32(body):
        raise error("checksum mismatch")
    try:
        return version, msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise error(f"{field} not msgpack: {exc}") from exc
