"""Helpers for the pure broker tests: messages and small hand-written filters."""

from __future__ import annotations

from broker_filter.broker import Broker, BrokerConfig
from broker_filter.amqp.message import Message


class FnFilter:
    """A filter object with the evaluate() contract of broker_filter.filters.Filter, counting calls."""

    def __init__(self, fn, description: str = ""):
        self.fn = fn
        self.description = description or repr(fn)
        self.calls = 0

    def evaluate(self, message, receiver=None):
        self.calls += 1
        return self.fn(message, receiver)

    def matches(self, message, receiver=None):
        return self.evaluate(message, receiver) is True


def prop_equals(key, value):
    return FnFilter(lambda m, r: (m.application_properties or {}).get(key) == value, f"{key} = {value!r}")


def msg(body=None, **props) -> Message:
    return Message(application_properties=dict(props), body=body)


def publish(broker: Broker, address: str, body=None, capabilities=(), **props) -> int:
    m = msg(body, **props)
    return broker.publish(address, repr(body).encode(), message=m, capabilities=capabilities)


def dispatch_all(broker: Broker, budget=None):
    """Dispatch until nothing is left; returns [(consumer, entry)]."""
    out = []
    for _ in range(10_000):
        got, more = broker.dispatch(budget)
        out.extend(got)
        if not more:
            return out
    raise AssertionError("dispatch never finished")


def assigned_bodies(assignments, consumer=None):
    return [e.message.body for c, e in assignments if consumer is None or c is consumer]
