"""mqstore: an embedded, actor-based message store byte-compatible with Apache RocketMQ 4.x.

    import mqstore
    with mqstore.open("./data") as store:
        result = store.put(mqstore.Message(topic="orders", body=b"...", keys=["order-1"]))
        batch = store.get("orders", 0, 0, 32)
"""

from .config import ConfigError, StoreConfig
from .faults import FaultPlan, InjectedFault
from .messages import GetResult, Message, MessageArrived, PutResult, QueryResult, Reply
from .storage.codec import HostAddress, MessageRecord, TopicError
from .storage.lockfiles import StoreLockedError
from .storage.status import GetMessageStatus, PutMessageStatus
from .store import MessageStore, open_store

open = open_store  # `mqstore.open(path, **settings)`, the way users spell it

__version__ = "0.1.0"

__all__ = [
    "open",
    "open_store",
    "MessageStore",
    "Message",
    "MessageRecord",
    "PutResult",
    "GetResult",
    "QueryResult",
    "MessageArrived",
    "Reply",
    "PutMessageStatus",
    "GetMessageStatus",
    "StoreConfig",
    "ConfigError",
    "TopicError",
    "StoreLockedError",
    "HostAddress",
    "FaultPlan",
    "InjectedFault",
]
