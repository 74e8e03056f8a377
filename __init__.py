"""mqstore: an embedded, actor-based message store byte-compatible with Apache RocketMQ 4.x.

    import mqstore
    with mqstore.open("./data") as store:
        result = store.put(mqstore.Message(topic="orders", body=b"...", keys=["order-1"]))
        batch = store.get("orders", 0, 0, 32)
"""

# Absolute imports: pytest imports this file by path (the repository root is the package),
# under the checkout directory's name, where relative imports have no parent package.
from mqstore.config import ConfigError, StoreConfig, StoreConfigMismatch, StoreGeometryAmbiguous
from mqstore.errors import StoreClosedError, StoreDiskFullError
from mqstore.faults import FaultPlan, InjectedFault
from mqstore.messages import GetResult, Message, MessageArrived, PutResult, QueryResult, Replied, Reply, StoreRef
from mqstore.storage.codec import HostAddress, MessageRecord, TopicError
from mqstore.storage.lockfiles import StoreDirectoryError, StoreLockedError
from mqstore.storage.status import GetMessageStatus, PutMessageStatus
from mqstore.put_pipeline import ActorClient
from mqstore.stats import StoreStatsSnapshot
from mqstore.store import MessageStore, open_store
from mqstore.log import prepare_loggers as _prepare_loggers
import importlib as _importlib
import importlib.util as _importlib_util
import sys as _sys

open = open_store  # `mqstore.open(path, **settings)`, the way users spell it

# Every stdlib logger the store uses, got now, at import: not in a caller's thread during an
# open, where a Ctrl-C could leave logging's lock held on 3.11-3.12 (mqstore.log._STDLIB_LOGGERS).
# The actors' come with their classes (StoreActor.__init_subclass__; the cleaner, which an open
# imports, imported here for it); then each module's, and the names the code spells out.
if _importlib_util.find_spec("mqstore.actors.cleaner") is not None:
    _importlib.import_module("mqstore.actors.cleaner")
_prepare_loggers(*(name for name in list(_sys.modules) if name.startswith("mqstore.")), "store", "offsets",
                 "notifier", "runtime", "supervisor", "cleaner", "puts", "storage.commitlog", "reput", "flush",
                 "allocate")  # fmt: skip

__version__ = "0.1.0"

__all__ = [
    "open",
    "open_store",
    "MessageStore",
    "ActorClient",
    "Message",
    "MessageRecord",
    "PutResult",
    "GetResult",
    "QueryResult",
    "MessageArrived",
    "StoreStatsSnapshot",
    "Reply",
    "Replied",
    "StoreRef",
    "PutMessageStatus",
    "GetMessageStatus",
    "StoreConfig",
    "ConfigError",
    "StoreConfigMismatch",
    "StoreGeometryAmbiguous",
    "TopicError",
    "StoreLockedError",
    "StoreDirectoryError",
    "StoreClosedError",
    "StoreDiskFullError",
    "HostAddress",
    "FaultPlan",
    "InjectedFault",
]
