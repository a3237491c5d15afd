"""The daemon's own requests to RabbitMQ 4's `/management` node (HTTP over AMQP 1.0).

RabbitMQ 4 declares, finds, binds and deletes queues for AMQP 1.0 clients over a request/response
link pair attached to `/management` (`management.py` relays a client's pair unchanged).  The daemon
uses the same node for what it keeps on the broker itself: the queues of the durable subscriptions
it keeps for JMS clients (`ProxyServer._place`, `durable_queue` below), so that a subscription
outlives the daemon, its upstream connection and its subscriber alike.

`Topology` is one such pair on the upstream connection, the daemon's own (its own session and
login, link name `broker-filter-topology-N`), made when first used and again after a reconnect.
A request is a message with `to` the resource (`/queues/q`, `/bindings`), `subject` the method,
`message-id` its identity and `reply-to` `$me`; the answer carries the request's id as its
`correlation-id` and the HTTP status as its `subject`.  Every request gets exactly one answer
callback: the broker's (`Reply.status` its code) or, when none can come (the connection went, the
pair was detached, no answer within the upstream's `answer_timeout`), a `Reply` with status None
and the reason.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import uuid
from typing import Any, Callable, NamedTuple
from urllib.parse import quote, unquote

from ..amqp import types as t
from ..amqp.message import Message, Properties
from ..amqp.sections import decode_message, encode_message
from ..engine.endpoints import Transfers
from ..engine.endpoints import LOCAL_ACTIVE, LOCAL_CLOSED, REMOTE_UNINIT, Terminus
from .forwarding import ACCEPTED
from .management import MANAGEMENT, pair_session
from .remote_links import link_state
from .wire import receive, send, settle_with

log = logging.getLogger("broker_filter.proxy.topology")

REPLY_CREDIT = 50
_names = itertools.count(1)
_ids = itertools.count(1)


class Reply(NamedTuple):
    """The answer to one request: `status` the broker's HTTP status ("200", "404", ...) and `body`
    its body; or status None and `error` saying why no answer came."""

    status: str | None
    body: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and self.status.startswith("2")

    def describe(self) -> str:
        if self.status is None:
            return self.error or "no answer"
        detail = self.body if isinstance(self.body, str) else ""
        return f"status {self.status}" + (f": {detail}" if detail else "")


def queue_path(name: str) -> str:
    return "/queues/" + quote(name, safe="")


class Topology:
    """The daemon's `/management` link pair on one upstream connection, and its requests in flight."""

    def __init__(self, upstream: Any):
        self.upstream = upstream
        self.closed = False
        self.waiting: dict[str, tuple[Callable[[Reply], None], Any]] = {}  # message id -> (answer, timer)
        self.queued: list[bytes] = []  # requests waiting for credit
        self.session = pair_session(upstream, self)
        name = f"broker-filter-topology-{next(_names)}"
        paired = {t.symbol("paired"): True}
        self.requests = self.session.sender(name, target=Terminus(address=MANAGEMENT), source=Terminus(address=MANAGEMENT),
                                            settled=True, properties=paired)
        self.replies = self.session.receiver(name, source=Terminus(address=MANAGEMENT),
                                             target=Terminus(address=MANAGEMENT), properties=paired)
        for link in (self.requests, self.replies):
            link_state(link).pair = self
        self.replies.handler = Transfers(self._reply)
        self.requests.open()
        self.replies.open()
        self.replies.flow(REPLY_CREDIT)
        upstream.pairs.add(self)

    # ------------------------------------------------------------------ requests
    def call(self, method: str, path: str, body: Any, answer: Callable[[Reply], None]) -> None:
        """Send one request; `answer(Reply)` is called once, on the daemon's loop."""
        if self.closed:
            self.upstream.loop.call_soon(lambda: answer(Reply(None, error="the management link pair is closed")))
            return
        message_id = f"broker-filter-{next(_ids)}"
        data = encode_message(Message(properties=Properties(message_id=message_id, to=path, subject=method,
                                                            reply_to="$me"), body=body))
        timeout = float(self.upstream.answer_timeout or 5.0)
        timer = self.upstream.loop.call_later(timeout, lambda: self._unanswered(message_id, method, path, timeout))
        self.waiting[message_id] = (answer, timer)
        self.queued.append(data)
        self._send()

    def _send(self) -> None:
        link = self.requests
        while self.queued and link.local_state == LOCAL_ACTIVE and link.credit > 0:
            send(link.ptr, b"", self.queued.pop(0), settled=True)

    def _unanswered(self, message_id: str, method: str, path: str, timeout: float) -> None:
        """A request unanswered for `timeout` s: it fails, and so does the pair (the next request
        makes a new one).  If the broker never answered the pair's attach either, the upstream
        connection is reconnected, as for any link's attach left unanswered (`RemoteUpstream`)."""
        entry = self.waiting.pop(message_id, None)
        if entry is None:
            return
        reason = f"upstream {self.upstream.name} did not answer {method} {unquote(path)} within {timeout:g} s"
        self._answer(entry[0], Reply(None, error=reason))
        self._fail_all(reason)
        attached = all(link.remote_state != REMOTE_UNINIT for link in (self.requests, self.replies))
        self.close()
        if attached:
            log.warning("%s: the daemon's /management link pair is closed", reason)
        else:
            self.upstream._reconnect_stuck(f"{reason} (the attach of the daemon's /management link pair went "
                                           "unanswered)")

    @staticmethod
    def _answer(answer: Callable[[Reply], None], reply: Reply) -> None:
        try:
            answer(reply)
        except Exception:  # noqa: BLE001 - one answer's failure must not keep the others
            log.exception("handling a management answer failed")

    def _reply(self, dlv: Any) -> None:
        link = self.replies
        data = receive(link.ptr, dlv)
        if data is None:
            return
        settle_with(dlv, ACCEPTED)
        if link.credit < REPLY_CREDIT // 2:
            link.flow(REPLY_CREDIT - link.credit)
        try:
            message = decode_message(data)
        except ValueError as e:
            log.warning("upstream %s sent a management answer that cannot be read: %s", self.upstream.name, e)
            return
        props = message.properties
        correlation = props.correlation_id if props is not None else None
        entry = self.waiting.pop(str(correlation), None) if correlation is not None else None
        if entry is None:
            return  # an answer given up on
        answer, timer = entry
        timer.cancel()
        subject = props.subject if props is not None else None
        self._answer(answer, Reply(str(subject) if subject is not None else "", message.body))

    def _fail_all(self, reason: str) -> None:
        self.closed = True
        self.queued.clear()
        waiting, self.waiting = self.waiting, {}
        for answer, timer in waiting.values():
            timer.cancel()
            self._answer(answer, Reply(None, error=reason))
        if self.upstream.topology_pair is self:
            self.upstream.topology_pair = None

    # ------------------------------------------------------------------ the pair's upstream events
    def upstream_open(self, link: Any) -> None:
        terminus = link.remote_target if link.is_sender else link.remote_source
        if terminus.null:
            return  # refused: the detach follows
        if link.is_sender:
            self._send()

    def upstream_flow(self, link: Any) -> None:
        if link.is_sender:
            self._send()

    def upstream_closed(self, link: Any) -> None:
        if link.local_state != LOCAL_CLOSED:
            link.close()
        if self.closed:
            return  # (the answer to the pair's own detach, or after it failed)
        c = link.remote_condition
        reason = (f"upstream {self.upstream.name} detached the daemon's /management link"
                  + (f": {c.name}: {c.description}" if c is not None else ""))
        log.warning("%s", reason)
        self._fail_all(reason)
        self.close()

    def session_ended(self, condition: Any) -> None:
        self.upstream.pairs.discard(self)
        self._fail_all(f"upstream {self.upstream.name} ended the daemon's /management session"
                       + (f": {condition.name}: {condition.description}" if condition is not None else ""))

    def lost(self, condition: str, description: str) -> None:
        self._fail_all(description)

    def close(self) -> None:
        """Detach the pair and end its session (the daemon stops, or the pair failed)."""
        self.closed = True
        self.upstream.pairs.discard(self)
        for link in (self.requests, self.replies):
            if link.local_state != LOCAL_CLOSED:
                link.close()
        if self.session.local_state != LOCAL_CLOSED:
            self.session.close()
            self.upstream.sessions.ending(self.session)


class HttpTopology:
    """The same requests, to RabbitMQ 3.x's management plugin (its HTTP API, `upstream.management_url`),
    for a RabbitMQ without a `/management` node.  Each is made on a worker thread of its own (the
    daemon's loop never waits on HTTP) and answered on the loop, in the `/management` node's terms:
    a declare of a queue that exists is answered 200 with the queue (as RabbitMQ 4 does), an
    inequivalent one 409, a binding 204.  The upstream's login is used (the management user needs
    the `management` tag and the vhost's configure, write and read permissions)."""

    closed = False

    def __init__(self, upstream: Any, url: str):
        from concurrent.futures import ThreadPoolExecutor
        from urllib.parse import urlsplit

        self.upstream = upstream
        parts = urlsplit(url)
        self.base = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "") + parts.path.rstrip("/")
        target = upstream._targets[0]
        self.user = unquote(parts.username) if parts.username else (target[1] or "")
        self.password = unquote(parts.password) if parts.password else (target[2] or "")
        self.vhost = quote(upstream.vhost, safe="")
        self.where = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="broker-filter-management")

    def call(self, method: str, path: str, body: Any, answer: Callable[[Reply], None]) -> None:
        engine = self.upstream.loop.engine

        def run() -> None:
            try:
                reply = self._request(method, path, body)
            except Exception as e:  # noqa: BLE001 - any failure is an answer
                reply = Reply(None, error=f"the management API at {self.where} could not be asked "
                                          f"({method} {unquote(path)}): {_reason(e)}")
            engine.call_soon_threadsafe(Topology._answer, answer, reply)

        self.pool.submit(run)

    def _request(self, method: str, path: str, body: Any) -> Reply:
        if path.startswith("/queues/"):
            queue = path[len("/queues/"):]
            at = f"/api/queues/{self.vhost}/{queue}"
            if method == "PUT":
                status, answer = self._http("PUT", at, {"durable": body.get("durable", True), "auto_delete": False,
                                                        "arguments": body.get("arguments", {})})
                if status == 201:
                    return Reply("201")
                if status == 204:  # it was there already: as RabbitMQ 4, answer with the queue
                    status, answer = self._http("GET", at, None)
                    return Reply("200", answer) if status == 200 else _http_reply(status, answer)
                return _http_reply(status, answer)
            status, answer = self._http(method, at, None)
            if method == "DELETE" and status == 204:
                return Reply("200")
            return _http_reply(status, answer)
        if path == "/bindings" and method == "POST":
            at = (f"/api/bindings/{self.vhost}/e/{quote(body['source'], safe='')}/q/"
                  f"{quote(body['destination_queue'], safe='')}")
            status, answer = self._http("POST", at, {"routing_key": body["binding_key"],
                                                    "arguments": body.get("arguments") or {}})
            return Reply("204") if status == 201 else _http_reply(status, answer)
        return Reply("501", f"{method} {path} is not a request the daemon makes")

    def _http(self, method: str, at: str, body: Any) -> tuple[int, Any]:
        import base64
        import json
        import urllib.error
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + at, data=data, method=method)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        timeout = float(self.upstream.answer_timeout or 5.0)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read()
                status = response.status
        except urllib.error.HTTPError as e:
            text, status = e.read(), e.code
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text.decode("utf-8", "replace")

    def close(self) -> None:
        self.pool.shutdown(wait=False)


def _http_reply(status: int, answer: Any) -> Reply:
    """An HTTP API answer in the `/management` node's terms (the status a `_failure` maps)."""
    reason = answer.get("reason") if isinstance(answer, dict) else answer
    if status == 400 and isinstance(reason, str) and "inequivalent" in reason:
        return Reply("409", reason)
    return Reply("403" if status == 401 else str(status), reason if isinstance(reason, str) else answer)


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None)
    return str(reason if reason is not None else e) or type(e).__name__


def topology(upstream: Any) -> Topology | HttpTopology | None:
    """What the daemon asks to declare, find and delete queues on `upstream`: its `/management`
    pair on RabbitMQ 4's connection (made now if need be), RabbitMQ 3.x's HTTP API when
    `upstream.management_url` names it; None otherwise, or while the upstream is not connected."""
    if not upstream.connected or not declares_queues(upstream):
        return None
    if upstream.traits.serves_management:
        pair = upstream.topology_pair
        if pair is None or pair.closed:
            pair = upstream.topology_pair = Topology(upstream)
        return pair
    http = upstream.topology_http
    if http is None:
        http = upstream.topology_http = HttpTopology(upstream, upstream.management_url)
    return http


def declares_queues(upstream: Any) -> bool:
    """Whether the daemon can declare queues on `upstream` (`topology` gives a way when connected)."""
    return bool(upstream.traits.serves_management or (upstream.management_url and upstream.product == "RabbitMQ"))


def consume_address(upstream: Any, queue: str) -> str:
    """The address a durable subscription's queue is consumed at: RabbitMQ 4's `/queues/Q`, else
    RabbitMQ 3.x's `/amq/queue/Q` (a queue that exists, not declared again)."""
    if upstream.traits.serves_management:
        return queue_path(queue)
    return "/amq/queue/" + queue


# --------------------------------------------------------------------------- durable subscription queues
QUEUE_PREFIX = "broker-filter.durable."
ARG_ADDRESS = "x-broker-filter-address"  # the address the subscriber attached to
ARG_FILTER = "x-broker-filter-selects"  # what the subscription selects (its filters' canonical text)
ARG_CLIENT = "x-broker-filter-client"  # the subscriber's container id
ARG_NAME = "x-broker-filter-subscription"  # the subscription's name


def durable_queue(kept_name: str) -> str:
    """The queue on the broker holding the durable subscription named `kept_name`
    (`sharing.kept_name`: its client id and subscription name): derived, so that no daemon needs
    to remember it."""
    if len(kept_name.encode("utf-8", "surrogatepass")) <= 200:
        return QUEUE_PREFIX + kept_name
    return QUEUE_PREFIX + hashlib.sha256(kept_name.encode("utf-8", "surrogatepass")).hexdigest()


def exchange_binding(address: str | None) -> tuple[str, str] | None:
    """(exchange, binding key) a RabbitMQ subscription address stands for: `/topic/K` (amq.topic),
    `/exchange/X[/K]`, `/exchanges/X[/K]` (RabbitMQ 4's form, percent-encoded); None for others."""
    if not address:
        return None
    if address.startswith("/topic/"):
        return "amq.topic", address[len("/topic/"):]
    for prefix, encoded in (("/exchange/", False), ("/exchanges/", True)):
        if address.startswith(prefix):
            rest = address[len(prefix):]
            exchange, _, key = rest.partition("/")
            if not exchange:
                return None
            return (unquote(exchange), unquote(key)) if encoded else (exchange, key)
    return None


def _ours(body: Any) -> dict | None:
    """The broker-filter arguments of a queue the broker described (GET or PUT answer), or None
    when the queue is not one the daemon made for a durable subscription."""
    args = body.get("arguments") if isinstance(body, dict) else None
    if not isinstance(args, dict) or ARG_NAME not in args:
        return None
    return {str(k): v for k, v in args.items()}


def _failure(what: str, reply: Reply) -> tuple[str, str]:
    """The condition a client link is refused with when a management request failed."""
    if reply.status is None:
        return "amqp:link:detach-forced", f"{what}: {reply.describe()}"
    condition = {"403": "amqp:unauthorized-access", "404": "amqp:not-found",
                 "409": "amqp:precondition-failed"}.get(reply.status, "amqp:internal-error")
    if reply.status == "400" and isinstance(reply.body, str) and reply.body.startswith("no exchange"):
        condition = "amqp:not-found"  # (RabbitMQ 4's answer to a binding to a missing exchange)
    return condition, f"{what}: the broker answered {reply.describe()}"


def ensure_subscription_queue(pair: Topology, queue: str, binding: tuple[str, str], arguments: dict,
                              done: Callable[[tuple[str, str] | None, bool], None]) -> None:
    """Make `queue` the durable subscription `arguments` describe, bound to `binding` (exchange,
    key): found as it is, or declared and bound.  A queue of the same subscription found with
    another address or selector is what JMS calls a new subscription under the same name: it is
    deleted (with what it held) and declared again.  `done(None, replaced)` when the queue is
    ready; `done((condition, description), False)` when not."""
    path = queue_path(queue)
    body = {"durable": True, "exclusive": False, "auto_delete": False, "arguments": arguments}

    def declared(reply: Reply, again: bool = False) -> None:
        if reply.status == "201":
            bind(again)
        elif reply.status == "200":
            found = _ours(reply.body)
            if found is None:
                done(("amqp:precondition-failed",
                      f"queue {queue!r} exists on the broker and was not made by broker-filter for a durable "
                      "subscription: the daemon does not use it"), False)
            elif all(found.get(k) == arguments.get(k) for k in (ARG_ADDRESS, ARG_FILTER)):
                bind(again)  # (the binding is there; declaring it again is harmless and mends a removed one)
            elif again:
                done(("amqp:internal-error", f"queue {queue!r} was declared again by another party meanwhile"),
                     False)
            else:
                log.info("durable subscription queue %s: subscribed again with another address or selector "
                         "(%s %s, was %s %s): replaced", queue, arguments.get(ARG_ADDRESS), arguments.get(ARG_FILTER),
                         found.get(ARG_ADDRESS), found.get(ARG_FILTER))
                pair.call("DELETE", path, None, deleted)
        else:
            done(_failure(f"declaring the durable subscription's queue {queue!r}", reply), False)

    def deleted(reply: Reply) -> None:
        if reply.ok or reply.status == "404":
            pair.call("PUT", path, body, lambda r: declared(r, again=True))
        else:
            done(_failure(f"replacing the durable subscription's queue {queue!r}", reply), False)

    def bind(replaced: bool) -> None:
        exchange, key = binding
        pair.call("POST", "/bindings", {"source": exchange, "binding_key": key, "destination_queue": queue,
                                        "arguments": {}},
                  lambda r: done(None, replaced) if r.ok else done(
                      _failure(f"binding the durable subscription's queue {queue!r} to exchange {exchange!r} "
                               f"with key {key!r}", r), False))

    pair.call("PUT", path, body, declared)


def find_subscription_queue(pair: Topology, queue: str,
                            done: Callable[[dict | None, tuple[str, str] | None], None]) -> None:
    """Look `queue` up: `done(arguments, None)` for a durable subscription's queue the daemon made,
    `done(None, None)` when there is none, `done(None, (condition, description))` when the broker
    could not be asked."""
    def found(reply: Reply) -> None:
        if reply.status == "404":
            done(None, None)
        elif reply.ok:
            done(_ours(reply.body), None)
        else:
            done(None, _failure(f"looking up the durable subscription's queue {queue!r}", reply))

    pair.call("GET", queue_path(queue), None, found)


def delete_subscription_queue(pair: Topology, queue: str) -> None:
    """Delete `queue` (an unsubscribe); a failure is logged (the queue then stays on the broker)."""
    def deleted(reply: Reply) -> None:
        if reply.ok or reply.status == "404":
            log.info("durable subscription queue %s deleted", queue)
        else:
            log.warning("deleting durable subscription queue %s failed: %s; it stays on the broker", queue,
                        reply.describe())

    pair.call("DELETE", queue_path(queue), None, deleted)


# --------------------------------------------------------------------------- subscriptions to RabbitMQ 4's exchanges
SUBSCRIPTION_PREFIX = "broker-filter.subscription."


def subscription_queue() -> str:
    """A new name for the queue of one subscription's feed (`declare_subscription`)."""
    return SUBSCRIPTION_PREFIX + uuid.uuid4().hex


def declare_subscription(pair: Topology, queue: str, binding: tuple[str, str], expires: float,
                         done: Callable[[tuple[str, str] | None], None]) -> None:
    """Declare `queue` for one non-durable subscription and bind it to `binding` (exchange, key).  It
    is neither exclusive nor auto-delete, so that it outlives the daemon's upstream connection and
    the subscription's feed is consumed again from it after a reconnect (`resume`), with what was
    routed to it meanwhile; unused for `expires` seconds (`x-expires`: no consumer, the daemon
    gone or cut off) the broker deletes it, and it is not durable (a broker restart ends it).  The
    daemon deletes it itself when the subscription ends (`end_subscription`).  `done(None)` when it
    is ready, `done((condition, description))` when not."""
    exchange, key = binding

    def declared(reply: Reply) -> None:
        if not reply.ok:
            done(_failure(f"declaring a queue for the subscription to exchange {exchange!r}", reply))
            return
        pair.call("POST", "/bindings", {"source": exchange, "binding_key": key, "destination_queue": queue,
                                        "arguments": {}}, bound)

    def bound(reply: Reply) -> None:
        if reply.ok:
            done(None)
            return
        done(_failure(f"binding the subscription's queue to exchange {exchange!r} with key {key!r}", reply))
        pair.call("DELETE", queue_path(queue), None, lambda r: None)  # (never consumed)

    pair.call("PUT", queue_path(queue), {"durable": False, "exclusive": False, "auto_delete": False,
                                         "arguments": {"x-queue-type": "classic",
                                                       "x-expires": max(1, int(expires * 1000))}}, declared)


def end_subscription(upstream: Any, queue: str) -> None:
    """A subscription's queue (`declare_subscription`) whose subscription ended: deleted, with what
    it held.  Not connected, or the broker could not do it: its `x-expires` deletes it later."""
    pair = topology(upstream)
    if pair is None:
        log.info("subscription queue %s is left to expire on upstream %s (not connected)", queue, upstream.name)
        return

    def deleted(reply: Reply) -> None:
        if not (reply.ok or reply.status == "404"):
            log.info("deleting subscription queue %s failed (%s); it expires on the broker", queue,
                     reply.describe())

    pair.call("DELETE", queue_path(queue), None, deleted)


def end_subscriptions(upstream: Any, queues: list[str]) -> None:
    """The daemon stops: the queues of its subscriptions (`declare_subscription`) are deleted, and
    its `/management` pair closed after the requests, so that the upstream connection's close waits
    for the pair's session's end, which RabbitMQ answers after the requests (`RemoteUpstream.stop`)."""
    pair = topology(upstream) if queues else None
    if pair is None:
        return
    for queue in queues:
        pair.call("DELETE", queue_path(queue), None, lambda reply: None)
    log.info("%d subscription queue(s) deleted on upstream %s at shutdown", len(queues), upstream.name)
    if isinstance(pair, Topology):
        pair.close()
