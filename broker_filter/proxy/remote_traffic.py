"""What a remote broker says on the proxy's own links (`remote.RemoteUpstream`): attach replies and
detaches, flow, deliveries on consumers' links and dispositions of publishers' deliveries, and the
answers read from proton's frame trace (an attach reply's offered-capabilities, a queue's ready count).

Deliveries and dispositions arrive straight from the engine's event loop as raw pointers
(`_received`, `_published`, routed per link by `RemoteUpstream._attach`); the rest comes through the
upstream connection's `Handler` events, each behind the `_guarded` error boundary.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from ..engine._cproton import lib
from ..engine.endpoints import LOCAL_CLOSED, Link
from .frametrace import parse_attach_capabilities, parse_available
from .remote_links import RemoteConsumer, _guarded, _key, link_state
from .upstream import ConsumerInfo, ErrorInfo, Loop, Outcome, RELEASED, UpstreamDelivery, evaluated_offers
from .wire import receive, remote_outcome, settle_with

log = logging.getLogger("broker_filter.proxy.upstream")


class LinkTraffic:
    """`RemoteUpstream`'s link events and frame-trace answers (module docstring).  Uses the upstream's
    `connection`, `loop`, `name`, `_endpoints`, `_traced`, `_awaiting_trace`, `probing` and `_applies`."""

    name: str
    connection: Any
    loop: Loop | None
    probing: RemoteConsumer | None
    probe_answer: Callable[[int | None], None] | None
    probe_timer: Any
    _awaiting_trace: int
    _endpoints: dict[str, Any]
    _traced: dict[str, frozenset[str]]

    @_guarded
    def on_link_open(self, link: Link) -> None:
        state = link.context
        if state is None:
            return  # not a link of the proxy's
        if state.pair is not None:
            state.pair.upstream_open(link)
            return
        ep = state.endpoint
        if ep is None or ep.closed:
            return
        if isinstance(ep, RemoteConsumer):
            src = link.remote_source
            if src.null:
                return  # refused: a detach with the reason follows
            echoed = src.filter
            source_caps = src.capabilities
            evaluated: tuple = ()
            if ep.spec.offered:
                # The attach's offered-capabilities, and the source's ones the proxy did not ask for
                # (RabbitMQ echoes a client's source capabilities).
                asked = set(ep.spec.capabilities)
                caps = self._traced.pop(link.name, frozenset()) | {c for c in source_caps if c not in asked}
                evaluated = evaluated_offers(ep.spec.offered, caps, echoed)
                if ep.offer_pending:
                    self._offer_answered(ep)
            info = ConsumerInfo(
                address=src.address,
                subscription=True if src.distribution_mode == "copy" else None,
                filters_applied=tuple(echoed) if isinstance(echoed, dict) else (),
                capabilities=source_caps,
                evaluated=evaluated,
                echoed={e.key: echoed[_key(e.key)] for e in ep.spec.passthrough
                        if isinstance(echoed, dict) and _key(e.key) in echoed and self._applies(e)} or None,
            )
            ep.ready = True
            ep.handler.on_consumer_ready(ep, info)
        else:
            if link.remote_target.null:
                return
            ep.ready = True
            ep.handler.on_publisher_ready(ep)
            if link.credit > 0:
                ep.handler.on_publisher_credit(ep)

    @_guarded
    def on_link_close(self, link: Link) -> None:
        state = link_state(link)
        pair = state.pair
        if pair is not None:
            state.pair = None
            pair.upstream_closed(link)
            return
        ep = state.endpoint
        if link.local_state != LOCAL_CLOSED:
            link.close()  # detached on both ends: the engine frees it
        if ep is not None and not ep.closed:
            c = link.remote_condition
            err = ErrorInfo(
                c.name if c is not None else "amqp:link:detach-forced",
                c.description if c is not None else f"upstream {self.name} detached the link",
                transient=False,
            )
            address = ep.spec.address if isinstance(ep, RemoteConsumer) else ep.address
            log.warning("upstream %s %s link %s (%s): %s: %s", self.name,
                        "detached" if ep.ready else "refused", link.name, address, err.condition, err.description)
            ep._closed_by_upstream(err)
        parked = state.recycle
        if parked is not None:
            state.recycle = None
            self._park(parked)
        state.endpoint = None

    @_guarded
    def on_flow(self, link: Link) -> None:
        state = link.context
        if state is None:
            return
        if state.pair is not None:
            state.pair.upstream_flow(link)
        elif link.is_sender:
            self._publisher_credit(state.endpoint, link.ptr)
        else:
            self._consumer_credit(state.endpoint, link.ptr)

    def _publisher_credit(self, ep: Any, link: Any) -> None:
        if ep is not None and ep.ready and not ep.closed and lib.pn_link_credit(link) > 0:
            ep.handler.on_publisher_credit(ep)

    def _consumer_credit(self, ep: Any, link: Any) -> None:
        """A flow on a consumer's link: the credit the broker left it.  RabbitMQ 3.x accounts for
        credit its own way (it may send more than granted, rabbitmq-server#2597, and use credit up
        without sending), so the feed takes the link's word over its own count."""
        if ep is None or not ep.ready or ep.closed:
            return
        # (deliveries that arrived and were not handled yet still count as credit to the feed)
        ep.handler.on_consumer_credit(ep, lib.pn_link_credit(link) + lib.pn_link_queued(link))

    def _received(self, ep: Any, link: Any, dlv: Any) -> None:
        """A transfer (pointers) on a consumer's link."""
        data = receive(link, dlv)
        if data is None:
            return
        if ep is None or ep.closed:
            settle_with(dlv, RELEASED)
            return
        if lib.pn_delivery_aborted(dlv):
            lib.pn_delivery_settle(dlv)
            return
        ud = UpstreamDelivery(data, dlv)
        if ep.order is not None:
            ep.order.arrived(ud)
        ep.handler.on_delivery(ep, ud)

    def _published(self, ep: Any, dlv: Any) -> None:
        """The broker's disposition of a delivery (a pointer) a publisher sent."""
        if ep is None:
            lib.pn_delivery_settle(dlv)
            return
        outcome = remote_outcome(dlv)
        if outcome is None and not lib.pn_delivery_settled(dlv):
            return
        cb = ep.pending.pop(dlv, None)
        lib.pn_delivery_settle(dlv)
        if cb is not None and not ep.closed:
            cb(outcome if outcome is not None else Outcome("accepted"))

    def _typed_failed(self, ep: Any) -> None:
        if not ep.closed:
            ep._closed_by_upstream(ErrorInfo("amqp:internal-error", "proxy failure on the upstream link"))

    # ------------------------------------------------------------------ answers read from the frame trace
    def _trace_frames(self, delta: int) -> None:
        """Trace frames while an answer proton has no accessor for is awaited: a consumer attach's
        reply that offers filters (a link's remote offered-capabilities; see the module docstring), or
        the flow answering a queue count (`RemoteConsumer.probe`)."""
        before = self._awaiting_trace
        self._awaiting_trace = max(0, before + delta)
        if self.connection is None or (before > 0) == (self._awaiting_trace > 0):
            return
        if self._awaiting_trace:
            self.connection.trace(functools.partial(self._on_trace, None))
        else:
            self.connection.trace(None)

    def probe_answered(self, n: int | None) -> None:
        """The count asked for by `RemoteConsumer.probe` (see there)."""
        consumer, answer = self.probing, self.probe_answer
        if consumer is None:
            return
        self.probing = self.probe_answer = None
        if self.probe_timer is not None:
            self.probe_timer.cancel()
            self.probe_timer = None
        self._trace_frames(-1)
        if consumer.link is not None and not consumer.closed:
            consumer.link.set_drain(False)
        answer(n)

    def _offer_answered(self, consumer: "RemoteConsumer") -> None:
        consumer.offer_pending = False
        self._trace_frames(-1)

    def _on_trace(self, transport: Any, message: str) -> None:
        try:
            if self.probing is not None:
                n = parse_available(message)
                if n is not None:
                    self.loop.call_later(0, lambda: self.probe_answered(n))  # not inside proton's I/O
                    return
            attach = parse_attach_capabilities(message)
            if attach is None:
                return
            name, caps = attach
            endpoint = self._endpoints.get(name)
            if endpoint is None or not endpoint.offer_pending:
                return  # not a consumer attach awaiting its reply
            self._traced[name] = caps
        except Exception:
            log.exception("upstream %s: reading an attach reply's capabilities failed", self.name)
