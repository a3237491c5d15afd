"""What the upstream broker does, from its open frame alone: one pure function from the `product` and
`version` connection properties (and whether it announced itself as another broker-filter) to a
frozen record.  No sockets, no proton: tested as a table (tests/proxy/test_traits.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Traits:
    """The upstream's behaviour the proxy adapts to.

    chained: another broker-filter (it stands in for a RabbitMQ behind it, maybe under its name).
    binds_exchange_keys: takes `/exchange/X/key` addresses with a binding key (RabbitMQ).
    modified_ok: honours a `modified` outcome (RabbitMQ 3.x ends the session on one).
    recycles_sessions: sessions outlive their links (RabbitMQ 4).
    dead_letters_undeliverable: modified{undeliverable-here} dead-letters (RabbitMQ 4).
    counts_queue: answers a drain without credit with the queue's ready count, safely (RabbitMQ 4;
        3.10's classic queue fails the channel on it).
    over_delivers: sends a consumer more than its credit (RabbitMQ 3.x, rabbitmq-server#2597).
    serves_management: serves the `/management` link pair (RabbitMQ 4, not through another daemon).
    passes_unknown_filters: filters the proxy does not know go to it as the client sent them (a remote
        broker: RabbitMQ's stream offsets; `ConsumerSpec.passthrough`).
    dynamic_sources: makes nodes for dynamic sources and targets (the embedded broker).
    named_subscriptions: a null source looks a durable subscription up by its link name (embedded).
    browses_queues: distribution-mode copy on a queue browses it (embedded).
    redelivers_in_place: a released message comes back to the head of its queue at once, so a feed
        need not keep custody of what it gave a client (embedded).
    in_process: the upstream is the embedded broker, in this process.
    closes_on_unparsable: drops the whole connection (every client's links on it) on a message its
        parser or section rules cannot take, such as an `amqp-value` list or float array (RabbitMQ 3.x's
        AMQP 1.0 plugin; RabbitMQ 4 ends only the sender's session): the daemon refuses those
        messages itself (broker_filter/proxy/admission.py).
    """

    chained: bool = False
    binds_exchange_keys: bool = False
    modified_ok: bool = True
    recycles_sessions: bool = False
    dead_letters_undeliverable: bool = False
    counts_queue: bool = False
    over_delivers: bool = False
    serves_management: bool = False
    passes_unknown_filters: bool = False
    dynamic_sources: bool = False
    named_subscriptions: bool = False
    browses_queues: bool = False
    redelivers_in_place: bool = False
    in_process: bool = False
    closes_on_unparsable: bool = False


# The embedded broker's: everything in process, Artemis's address model.
EMBEDDED = Traits(dynamic_sources=True, named_subscriptions=True, browses_queues=True, redelivers_in_place=True,
                  in_process=True)


def major(version: str | None) -> int:
    """The major number of a `version` connection property ("4.0.5" -> 4); 0 when absent or unreadable."""
    head = (version or "").split(".", 1)[0].strip()
    return int(head) if head.isdigit() else 0


def traits_of(product: str | None, version: str | None, chained: bool = False) -> Traits:
    """The traits of an upstream whose open frame carried `product` and `version` (None when absent);
    `chained`: it also carried the `broker-filter` property (a broker-filter under another name)."""
    chained = chained or product == "broker-filter"
    rabbit = product is not None and "rabbitmq" in product.lower()
    four = rabbit and major(version) >= 4
    return Traits(chained=chained, binds_exchange_keys=rabbit, modified_ok=not rabbit or four,
                  recycles_sessions=four, dead_letters_undeliverable=four, counts_queue=four,
                  over_delivers=rabbit and not four, serves_management=four and not chained,
                  passes_unknown_filters=True,
                  closes_on_unparsable=rabbit and not four)
