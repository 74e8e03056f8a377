"""mqstore: an embedded, actor-based message store byte-compatible with Apache RocketMQ 4.x."""

__version__ = "0.1.0"
