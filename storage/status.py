"""Typed outcomes of the storage layer (spec §6.6, §13.1), named as in RocketMQ 4.4.0.

Operating errors are values of these enums, never exceptions. Each value equals its member
name; the Java spelling, where it differs, is in the comment.
"""

from __future__ import annotations

from typing import NamedTuple
from enum import Enum

__all__ = [
    "AppendMessageResult",
    "AppendMessageStatus",
    "GetMessageStatus",
    "PutMessageResult",
    "PutMessageStatus",
]


class PutMessageStatus(str, Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"  # Java: CREATE_MAPEDFILE_FAILED
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"  # Java: OS_PAGECACHE_BUSY
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class AppendMessageStatus(str, Enum):
    PUT_OK = "PUT_OK"
    END_OF_FILE = "END_OF_FILE"
    MESSAGE_SIZE_EXCEEDED = "MESSAGE_SIZE_EXCEEDED"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetMessageStatus(str, Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class AppendMessageResult(NamedTuple):
    """What one append into one segment did (§6.4 step 4).

    For END_OF_FILE, `wrote_bytes` is the blank's size (the rest of the file) and the
    message itself was not written. `msg_id` is comma-joined for a batch.
    """

    status: AppendMessageStatus
    wrote_offset: int = 0
    wrote_bytes: int = 0
    msg_id: str = ""
    store_timestamp: int = 0
    logics_offset: int = 0
    msg_num: int = 1
    page_cache_rt_ms: int = 0

    @property
    def is_ok(self) -> bool:
        return self.status is AppendMessageStatus.PUT_OK

    @property
    def next_offset(self) -> int:
        """The commitlog offset just past what was written (a GroupCommitRequest's target)."""
        return self.wrote_offset + self.wrote_bytes


class PutMessageResult(NamedTuple):
    """A put's status for the producer plus the append facts (None when nothing was appended)."""

    status: PutMessageStatus
    append_result: AppendMessageResult | None = None
    detail: str = ""

    @property
    def is_ok(self) -> bool:
        """RocketMQ's `isOk()`: the message is stored, even if a flush/replica wait timed out."""
        return self.append_result is not None and self.append_result.is_ok
