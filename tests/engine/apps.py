"""Engine applications for the engine tests: a tiny in-process message store ("echo": what is
sent to an address comes back to a receiver of that address) and a recording client handler."""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from broker_filter.engine import Condition, Handler
from broker_filter.engine.endpoints import Connection, Delivery, Link


class EchoServer(Handler):
    """Accepts every link; messages sent to an address are queued and given to that address's
    receivers as they grant credit.  `refuse`: addresses whose links are refused."""

    def __init__(self, credit: int = 100, refuse: tuple[str, ...] = ()):
        self.credit = credit
        self.refuse = refuse
        self.queues: dict[str, deque] = defaultdict(deque)
        self.senders: dict[str, list] = defaultdict(list)
        self.opened_links: list[Link] = []
        self.sources: list[Any] = []
        self.outcomes: list[tuple[int, Any]] = []
        self.disconnected: list[Any] = []

    def on_link_open(self, link: Link) -> None:
        if link.is_sender:
            source = link.remote_source
            self.sources.append(source)
            if source.filter_error:
                link.set_source(source)
                link.open()
                link.close(Condition("amqp:decode-error", f"source filter: {source.filter_error}"))
                return
            address = source.address or ""
        else:
            address = link.remote_target.address or ""
        if address in self.refuse:
            link.close(Condition("amqp:not-found", f"no such address {address!r}"))
            return
        link.context = address
        if link.is_sender:
            link.set_source(link.remote_source)
            self.senders[address].append(link)
        else:
            link.set_target(link.remote_target)
        link.open()
        self.opened_links.append(link)
        if not link.is_sender:
            link.flow(self.credit)

    def on_link_close(self, link: Link) -> None:
        self._drop(link)
        super().on_link_close(link)

    def _drop(self, link: Link) -> None:
        """A sending link goes: what it sent unsettled goes back to the front of its queue."""
        if link in self.senders.get(link.context, ()):
            self.senders[link.context].remove(link)
            unsettled = [d.context for d in link.unsettled.values()]
            self.queues[link.context].extendleft(reversed(unsettled))
            self._deliver(link.context)

    def on_message(self, delivery: Delivery, data: memoryview) -> None:
        address = delivery.link.context
        self.queues[address].append(bytes(data))
        delivery.accept()
        delivery.link.flow(1)
        self._deliver(address)

    def on_flow(self, link: Link) -> None:
        if link.is_sender:
            self._deliver(link.context)

    def on_delivery_update(self, delivery: Delivery) -> None:
        self.outcomes.append((delivery.remote_state, delivery.remote_condition))
        if delivery.remote_settled:
            delivery.settle()

    def on_disconnected(self, connection: Connection, error: Any) -> None:
        self.disconnected.append(error)
        for session in connection.sessions:
            for link in list(session.links):
                self._drop(link)

    def _deliver(self, address: str) -> None:
        queue = self.queues[address]
        for link in self.senders.get(address, ()):
            while queue and link.credit > 0:
                data = queue.popleft()
                link.send(data).context = data
        for link in self.senders.get(address, ()):
            if link.drain_mode and link.credit > 0:
                link.drained()


class Recorder(Handler):
    """A client handler that records what happens."""

    def __init__(self, accept: bool = True):
        self.accept = accept
        self.opened: list[Link] = []
        self.sources: list[Any] = []  # each link's remote source as it attached
        self.closed: list[tuple[Link, Any]] = []
        self.messages: list[bytes] = []
        self.deliveries: list[Delivery] = []
        self.updates: list[tuple[int, bool]] = []
        self.flows = 0
        self.connection_open = False
        self.disconnected: list[Any] = []

    def on_connection_open(self, connection: Connection) -> None:
        self.connection_open = True

    def on_link_open(self, link: Link) -> None:
        self.opened.append(link)
        self.sources.append(link.remote_source)

    def on_link_close(self, link: Link) -> None:
        self.closed.append((link.name, link.remote_condition))
        super().on_link_close(link)

    def on_flow(self, link: Link) -> None:
        self.flows += 1

    def on_message(self, delivery: Delivery, data: memoryview) -> None:
        self.messages.append(bytes(data))
        if self.accept:
            delivery.accept()
        else:
            self.deliveries.append(delivery)

    def on_delivery_update(self, delivery: Delivery) -> None:
        self.updates.append((delivery.remote_state, delivery.remote_settled))
        if delivery.remote_settled:
            delivery.settle()

    def on_disconnected(self, connection: Connection, error: Any) -> None:
        self.disconnected.append(error)


def settle_proxy(container: Any, loop: Any, pairs: list, rounds: int = 50) -> None:
    """Pump each (a, b) connection pair of `container`'s engine, run the proxy's call_soon work
    (`loop`: its EngineLoop, run by the engine's `after_turn`) and due timers, until nothing happens."""
    from broker_filter.engine.memory import pump

    engine = container.loop
    for _ in range(rounds):
        moved = sum(pump(engine, a, b) for a, b in pairs)
        engine.dirty.clear()  # pump moved every byte there was
        before = loop.rounds
        engine.after_turn()
        ran = engine.run_timers()
        if not moved and loop.rounds == before and not ran:
            return
    raise RuntimeError("the proxy did not settle")
