"""What a feed works with, without behaviour of its own: the outcomes it settles with (`Outcome`),
the client links it serves (`Outlet`), the upstream deliveries it holds (`Custody`), its counters
(`FeedStats`) and the I/O layer it asks (`FeedIO`).

A leaf of the feed side: `forwarding` (the queue feed), `moving` (its moves for the search) and
`fanout` (the shared subscription) import it; it imports nothing of the proxy.  The rest of the
proxy imports these names from `forwarding`, as before.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..amqp import redelivery_bytes
from ..filters.base import Filter


@dataclass(frozen=True)
class Outcome:
    """An AMQP 1.0 terminal delivery state.

    kind: "accepted" | "rejected" | "released" | "modified".
    `error` is (condition, description) for rejected; the modified fields follow the spec.
    """

    kind: str
    error: tuple[str, str | None] | None = None
    delivery_failed: bool = False
    undeliverable_here: bool = False
    annotations: dict[Any, Any] | None = None
    # released only: no client ever received the message (the proxy held it), so the upstream may
    # undo the acquisition: first-acquirer stays true (AMQP 1.0 3.2.1).  An upstream that cannot
    # (RabbitMQ) treats it as a plain release.
    unacquired: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("accepted", "rejected", "released", "modified"):
            raise ValueError(f"not an AMQP outcome: {self.kind!r}")


ACCEPTED = Outcome("accepted")
RELEASED = Outcome("released")
UNACQUIRED = Outcome("released", unacquired=True)
DELIVERY_FAILED = Outcome("modified", delivery_failed=True)
# A subscription's copy larger than every selecting link's max-message-size (AMQP 1.0 2.7.3: a sender
# must not send it; the copy is this subscription's own, so it is rejected for it, never dropped unsaid).
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"


def too_large(size: int, limit: int) -> Outcome:
    return Outcome("rejected", error=(MESSAGE_SIZE_EXCEEDED,
                                      f"a {size}-byte message exceeds the receiving link's max-message-size {limit}"))


def filter_identity(filter: Filter, receiver: str | None = None) -> str:
    """A short stable name for what a filter selects: its text, and the receiving connection when
    the filter depends on it (no-local).  Equal filters on different links, or in different daemons,
    have the same identity."""
    text = filter.description or repr(filter)
    if filter.no_local:
        text += "\x00" + str(receiver)
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class FeedIO:
    """What a feed asks of the I/O layer (`feeds.FeedBinding`), which calls the feed's `on_*`
    methods; decisions come back as calls on it.  `probe` is optional: declared here as None."""

    def send(self, outlet: "Outlet", delivery: Any, data: bytes) -> Any:
        """Transfer `data` (the delivery's bytes, or their redelivery form) on the outlet's client
        link; return the client delivery tag."""
        raise NotImplementedError

    def settle_upstream(self, delivery: Any, outcome: Outcome) -> None:
        raise NotImplementedError

    def flow_upstream(self, n: int) -> None:
        raise NotImplementedError

    # `probe(answer) -> bool | None`: ask the upstream how many messages the queue has ready (a
    # drain without credit, which RabbitMQ 4 answers with `available`); False if it cannot be asked
    # now (credit outstanding), None if this upstream is never asked.  answer(n) later: n >= 0 the
    # count, -1 the question was withdrawn (ask again), None the upstream did not answer (see
    # `QueueSearch.look`).  None here: an I/O layer that cannot ask at all.
    probe: Callable[[Callable[[int | None], None]], bool | None] | None = None

    def recycle(self, delivery: Any, data: bytes, done: Callable[[bool], None]) -> bool:
        """Publish `data` (the delivery's bytes with the offered mark) to the tail of the queue.
        False if that cannot start now (the feed keeps the message and the I/O layer calls `pump`
        when publishing is possible again).  Else done(True) once the broker accepted the copy (the
        feed then accepts the original) or done(False) if it did not (the original is held again).
        `done` is never called from inside `recycle`."""
        raise NotImplementedError


@dataclass
class FeedStats:
    delivered: int = 0  # messages sent to clients
    redelivered: int = 0  # of those, given back by a client and sent again from the proxy
    filtered: int = 0  # non-matches settled as consumed (subscriptions only)
    too_large: int = 0  # subscription copies rejected: larger than every selecting link's max-message-size
    undecodable: int = 0  # messages whose sections could not be decoded (no filter selects them)
    recycled: int = 0  # held messages moved to the queue's tail
    moving: int = 0  # moves in flight right now
    passes: int = 0  # searches of the queue completed (a marked copy came round)
    blocked: int = 0  # times a queue feed stopped pulling with outlets waiting
    handed_back: int = 0  # held messages the feed moved to the tail for other consumers (see QueueSearch.look)
    held: int = 0  # messages held right now
    held_peak: int = 0
    starved: int = 0  # outlets with credit waiting on a blocked feed right now


class Outlet:
    """One client receiving link.  `receiver` is its connection identity "<instance>/<connection>"."""

    __slots__ = ("name", "filter", "receiver", "credit", "in_flight", "delivered", "io_ref", "io_owner",
                 "presettled", "identity", "waiting_since", "max_size", "draining", "evaluated", "matched",
                 "eval_ns", "shared_base")

    def __init__(self, name: str, filter: Any, receiver: str | None = None, io_ref: Any = None,
                 presettled: bool = False, max_size: int = 0):
        self.name = name
        # the client link's max-message-size (0: no limit): a larger message is never sent to it;
        # it goes to another link that selects it and can take it, or stays as one nobody selects
        self.max_size = max_size
        self.presettled = presettled  # the client asked for pre-settled deliveries (at most once)
        self.filter = filter
        self.receiver = receiver
        self.credit = 0
        self.in_flight: dict[Any, Custody] = {}  # client tag -> what the client has unsettled
        self.delivered = 0
        self.io_ref = io_ref  # the I/O layer's link object
        self.io_owner: Any = None  # what serves the link in the I/O layer (opaque here)
        self.identity = filter_identity(filter, receiver)
        self.waiting_since: float | None = None  # since when it has had credit and received nothing
        self.draining: Any = None  # the I/O layer's token while it drains the link (see server `_drain`)
        # Its filter's cost (plain ints on the message path; the metrics and /links read them):
        # messages its filter was evaluated on, the ones it selected, and the evaluation time in ns,
        # timed on one evaluation in EVAL_SAMPLE and scaled.
        self.evaluated = 0
        self.matched = 0
        self.eval_ns = 0
        self.shared_base: int | None = None  # a shared subscription's message count when last counted

    def __repr__(self) -> str:
        return f"<Outlet {self.name} credit={self.credit} in_flight={len(self.in_flight)}>"


# One filter evaluation in EVAL_SAMPLE is timed (and counted EVAL_SAMPLE times): the clock costs
# more than most evaluations.
EVAL_SAMPLE = 32
EVAL_MASK = EVAL_SAMPLE - 1
_ns = time.perf_counter_ns

_NO_MARK: dict = {}  # shared: a mark is never changed in place


class Custody:
    """An upstream delivery the feed holds or a client has unsettled, with what the proxy knows of it:
    the decoded sections, the filters it was offered to (`mark`, from a moved copy's annotation),
    outlets it must not go to again, and its redelivery state."""

    __slots__ = ("delivery", "message", "reads", "excluded", "mark", "redelivered", "failed", "refused",
                 "kept", "offered", "annotations")

    def __init__(self, delivery: Any, message: Any, reads: frozenset, mark: dict | None = None):
        self.delivery = delivery
        self.message = message
        self.reads = reads
        self.mark: dict = _NO_MARK if mark is None else mark  # filter identity -> [feed token, wall-clock ms] of the offer
        self.excluded: frozenset = frozenset()
        self.redelivered = False  # a client had it: first-acquirer false from now on
        self.failed = 0  # failed attempts in the proxy (added to the header's delivery-count)
        self.refused = 0  # the pass in which the broker refused its copy (not moved again in it)
        self.kept = False  # held for links that select it and have no credit (see `QueueSearch.keep`)
        self.offered = -1  # the feed's `_offers` when every outlet with credit last turned it down
        self.annotations: dict | None = None  # what clients' `modified` outcomes added (3.4.5)

    def data(self) -> bytes:
        if not self.redelivered:
            return self.delivery.data
        return redelivery_bytes(self.delivery.data, failed=self.failed)


UNDECODABLE = object()  # what `forwarding.decode_reads` gives for a message that could not be decoded
