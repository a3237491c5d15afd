"""ConnectionRegistry on a real Container with real proton clients: the link census and the
counting of client publishes and outcomes."""

from __future__ import annotations

import queue
import threading

from prometheus_client import CollectorRegistry
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector
from proton.utils import BlockingConnection

from broker_filter.lifecycle import ConnectionRegistry
from broker_filter.metrics import Metrics


class Feeder(MessagingHandler):
    """Sends three messages on `feed`; accepts whatever is published."""

    def __init__(self):
        super().__init__(auto_accept=True)
        self.sent = 0
        self.results: queue.Queue = queue.Queue()

    def on_link_opening(self, event):
        link = event.link
        if link.is_sender:
            link.source.copy(link.remote_source)
        else:
            link.target.copy(link.remote_target)

    def on_sendable(self, event):
        while event.link.credit and self.sent < 3 and event.link.source.address == "feed":
            event.link.send(Message(body=self.sent))
            self.sent += 1


def test_census_and_client_counters():
    metrics = Metrics(CollectorRegistry())
    feeder = Feeder()
    registry = ConnectionRegistry(feeder, metrics)
    container = Container(registry)
    acceptor = container.acceptor("127.0.0.1", 0)
    port = acceptor._selectable._delegate.getsockname()[1]
    injector = EventInjector()
    container.selectable(injector)
    feeder.on_census = lambda event: feeder.results.put(registry.census())

    def stop(event):
        acceptor.close()
        injector.close()
        container.stop()

    feeder.on_stop_test = stop
    thread = threading.Thread(target=container.run, daemon=True)
    thread.start()
    try:
        conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=20)
        sender = conn.create_sender("inbox")
        sender.send(Message(body="a"))
        sender.send(Message(body="b"))
        receiver = conn.create_receiver("feed", credit=10)
        for outcome in ("accept", "accept", "reject"):
            receiver.receive(timeout=20)
            getattr(receiver, outcome)()
        sender.send(Message(body="c"))  # a round trip: the settlements above have reached the server
        injector.trigger(ApplicationEvent("census"))
        links, credit = feeder.results.get(timeout=20)
        assert links == {"consumer": 1, "producer": 1}
        assert credit == {"feed": receiver.link.credit} and credit["feed"] > 0  # what the client still grants
        conn.close()
    finally:
        injector.trigger(ApplicationEvent("stop_test"))
        thread.join(20)
    sample = metrics.registry.get_sample_value
    assert sample("broker_filter_messages_published_total", {"address": "inbox"}) == 3
    assert sample("broker_filter_outcomes_total", {"address": "feed", "outcome": "accepted"}) == 2
    assert sample("broker_filter_outcomes_total", {"address": "feed", "outcome": "rejected"}) == 1
    assert sample("broker_filter_outcomes_total", {"address": "feed", "outcome": "released"}) == 0
