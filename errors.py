"""The store's exceptions: API misuse that is not a type or value mistake, and an open that
cannot start."""

from __future__ import annotations

import errno

__all__ = ["StoreClosedError", "StoreDiskFullError"]


class StoreClosedError(RuntimeError):
    """A call on a `MessageStore` after its `close()` (a closed store has no maps, no actors
    and no files open). The closed-store rule, with its exceptions, is stated once in the
    README ("The two APIs": every call raises this but `close()` and the progress views; an
    `ActorClient` made before the close answers SERVICE_NOT_AVAILABLE)."""


class StoreDiskFullError(OSError):
    """`open()` found no room on the disk for a file the store cannot start without (the
    lock, abort marker or checkpoint of a store). The open is refused before any actor starts:
    nothing is left held, and no half-made abort marker or checkpoint is left behind, so the
    same open succeeds once space is freed. An OSError with errno ENOSPC and the file's path,
    so a host that already handles OSError needs nothing new. (A store that is open when the
    disk fills stays up and refuses puts with SERVICE_NOT_AVAILABLE "disk full" instead.)"""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(errno.ENOSPC, f"disk full: no space for {what} {path}; free space and open again", path)

    def __str__(self) -> str:
        return str(self.strerror)
