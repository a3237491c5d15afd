"""broker-filter: server-side message filtering for AMQP 1.0."""

__version__ = "0.1.0"
