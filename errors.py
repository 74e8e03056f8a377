"""The store's one exception for API misuse that is not a type or value mistake."""

from __future__ import annotations

__all__ = ["StoreClosedError"]


class StoreClosedError(RuntimeError):
    """A call on a `MessageStore` after its `close()`. Every public method raises it (a closed
    store has no maps, no actors and no files open); `close()` itself stays idempotent."""
