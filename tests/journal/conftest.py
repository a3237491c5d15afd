"""Helpers for the journal tests: real encoded AMQP messages and a controllable clock."""

from __future__ import annotations

import os

import pytest

from broker_filter.amqp import types as t
from broker_filter import amqp
from broker_filter.archive.journal import Journal
from broker_filter.amqp.message import Header, Message, Properties

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


class Clock:
    """A monotonic clock the test moves by hand (the journal's roll-by-age reads it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def typed_message(i: int = 0, **app) -> Message:
    return Message(
        header=Header(durable=True, priority=t.ubyte(i % 10)),
        message_annotations={t.symbol("x-opt-partition"): t.int32(i % 3)},
        properties=Properties(message_id=t.ulong(2**64 - 1 - i), subject=f"s{i}", creation_time=t.timestamp(1_700_000_000_000 + i)),
        application_properties={"i": t.int32(i), "big": 2**40 + i, "f": t.float32(0.5), "sym": t.symbol("k"), **app},
        body=b"payload-%d" % i,
    )


def encoded(message: Message) -> bytes:
    return amqp.encode_message(message)


@pytest.fixture
def journals():
    """Journals made by a test, closed at its end even when it fails (their writer threads stop)."""
    made: list[Journal] = []

    def make(directory, **options) -> Journal:
        j = Journal(directory, **options)
        made.append(j)
        return j

    yield make
    for j in made:
        assert j.close(timeout=10)


@pytest.fixture
def make_message():
    """make_message(i, **application_properties) -> (Message, its encoded bytes)."""

    def make(i: int = 0, **app):
        m = typed_message(i, **app)
        return m, encoded(m)

    return make
