"""Many filtered subscribers on one RabbitMQ topic address: through the daemon (one shared upstream
subscription, dispatched through the subscription index) against the same subscribers attached to
RabbitMQ directly and filtering in the client.

S subscribers (1, 100, 1,000, 10,000; spread over min(S, 100) connections) on `/topic/<name>`; subscriber
i selects customer c<i>: mostly `customer = 'c<i>'`, one in 20 `customer IN ('c<i>', 'none')`, one in
20 a legacy topic binding `orders.c<i>.*` on the subject, and one in 1,000 the unindexable
`customer LIKE 'c<i>'`.  Message j goes to customer c<(7919 j + 13) mod S> (subject `orders.c<k>.new`),
so each message is selected by exactly one subscriber.  A publisher sends the messages straight to
RabbitMQ; per published message the bench reports the daemon's CPU and RabbitMQ's CPU (beam.smp,
from /proc), from the first publish to the last expected receive.  RabbitMQ's figure is beam.smp's CPU over that time;
the node is shared, so the bench also gives its CPU rate measured idle just before (cores busy) and
the figure with that rate subtracted ("net", noisy when other work on the node comes and goes).

    python bench/fanout_bench.py [--upstream amqp://guest:guest@127.0.0.1:5672] [--messages 2000]
                                 [--subscribers 1,100,1000,10000] [--direct-max 1000]

Direct runs stop at --direct-max subscribers: at 10,000 RabbitMQ would keep 10,000 queues and send
10,000 copies of each message to one Python client process, which cannot keep up.  Every queue a run
leaves bound to its topic (RabbitMQ keeps /topic/ subscription queues after their link detaches) is
deleted afterwards with `rabbitmqctl eval` (3.10) or scripts/rabbitmq4.sh ctl eval (4.0).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from python_clients import ROOT, cpu_seconds, start_proxy  # noqa: E402

TOPIC_BINDING = "apache.org:legacy-amqp-topic-binding:string"


def subscriber_filter(i: int) -> tuple[str, str]:
    """(kind, text) of subscriber i: ("selector", JMS selector) or ("topic", binding pattern)."""
    if i % 1000 == 3:
        return "selector", f"customer LIKE 'c{i}'"
    if i % 20 == 1:
        return "selector", f"customer IN ('c{i}', 'none')"
    if i % 20 == 2:
        return "topic", f"orders.c{i}.*"
    return "selector", f"customer = 'c{i}'"


def customer_of(j: int, subscribers: int) -> int:
    return (7919 * j + 13) % subscribers


def subscribers_proc(url: str, address: str, count: int, direct: bool, expect: int, ready, out_q) -> None:
    """Attach `count` receivers over min(count, 100) connections; count what each receives (direct:
    every copy, kept only when its own filter selects it); report once `expect` selected arrived."""
    from proton import Described, symbol
    from proton.handlers import MessagingHandler
    from proton.reactor import Container, Filter, Selector

    from broker_filter.filters import compile_selector

    filters = [subscriber_filter(i) for i in range(count)]
    local = []
    for kind, text in filters:
        if kind == "selector":
            f = compile_selector(text)
            local.append(lambda m, f=f: f.evaluate(m) is True)
        else:
            rx = re.compile("^" + re.escape(text).replace(r"\*", r"[^.]+").replace(r"\#", ".*") + "$")
            local.append(lambda m, rx=rx: m.properties is not None and m.properties.subject is not None
                         and rx.match(str(m.properties.subject)) is not None)

    class Subs(MessagingHandler):
        def __init__(self):
            super().__init__(prefetch=0, auto_accept=True)
            self.opened = 0
            self.selected = 0
            self.copies = 0
            self.wrong = 0
            self.last = None

        def on_start(self, event):
            nconn = min(count, 100)
            conns = [event.container.connect(url) for _ in range(nconn)]
            for i, (kind, text) in enumerate(filters):
                opts = []
                if not direct:
                    if kind == "selector":
                        opts.append(Selector(text))
                    else:
                        opts.append(Filter({symbol("topic"): Described(symbol(TOPIC_BINDING), text)}))
                r = event.container.create_receiver(conns[i % nconn], address, name=f"s{i}", options=opts)
                r.bf_index = i
                r.flow(20)
            event.container.schedule(1.0, self)

        def on_link_opened(self, event):
            if event.receiver is not None:
                self.opened += 1
                if self.opened == count:
                    ready.set()

        def on_timer_task(self, event):
            if self.last is not None and time.time() - self.last > 15:
                self._done(event)
                return
            event.container.schedule(1.0, self)

        def on_message(self, event):
            from broker_filter.amqp import decode_message

            self.last = time.time()
            rcv = event.receiver
            self.copies += 1
            if rcv.credit < 10:
                rcv.flow(20 - rcv.credit)
            m = decode_message(event.message.encode(), frozenset({"application_properties", "properties"}))
            ok = local[rcv.bf_index](m)
            if direct:
                self.selected += ok
            else:
                self.selected += 1
                self.wrong += not ok  # the daemon sent a message this subscriber's filter does not select
            if self.selected >= expect:
                self._done(event)

        def _done(self, event):
            out_q.put({"selected": self.selected, "copies": self.copies, "wrong": self.wrong, "t": self.last})
            event.container.stop()

    Container(Subs()).run()


def publish(url: str, address: str, count: int, subscribers: int) -> float:
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    class Pub(MessagingHandler):
        def __init__(self):
            super().__init__()
            self.sent = 0
            self.accepted = 0

        def on_start(self, event):
            self.conn = event.container.connect(url)
            event.container.create_sender(self.conn, address)

        def on_sendable(self, event):
            while event.sender.credit and self.sent < count:
                k = customer_of(self.sent, subscribers)
                event.sender.send(Message(body=b"x" * 64, subject=f"orders.c{k}.new",
                                          properties={"customer": f"c{k}", "j": self.sent}))
                self.sent += 1

        def on_accepted(self, event):
            self.accepted += 1
            if self.accepted == count:
                event.connection.close()

    t0 = time.time()
    Container(Pub()).run()
    return t0


def beam_pid(port: int) -> int:
    out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if f"127.0.0.1:{port} " in line and "beam.smp" in line:
            return int(re.search(r"pid=(\d+)", line).group(1))
    raise RuntimeError(f"no beam.smp listening on {port}")


def ctl(port: int) -> list[str]:
    return ["rabbitmqctl"] if port == 5672 else ["bash", str(ROOT / "scripts" / "rabbitmq4.sh"), "ctl"]


def delete_topic_queues(port: int, topic: str) -> int:
    expr = (f'Ds = [D || {{binding, _, <<"{topic}">>, D, _}} <- rabbit_binding:list_for_source('
            f'rabbit_misc:r(<<"/">>, exchange, <<"amq.topic">>))], [begin {{ok, Q}} = rabbit_amqqueue:lookup(D), '
            f'rabbit_amqqueue:delete(Q, false, false, <<"bench">>) end || D <- Ds], length(Ds).')
    out = subprocess.run([*ctl(port), "eval", expr], capture_output=True, text=True, timeout=300).stdout.strip()
    return int(out) if out.isdigit() else -1


def topic_queues(port: int, topic: str) -> int:
    out = subprocess.run([*ctl(port), "list_bindings", "-q", "source_name", "routing_key"], capture_output=True,
                         text=True, timeout=120).stdout
    return sum(1 for line in out.splitlines() if line.split("\t") == ["amq.topic", topic])


def run(mode: str, upstream: str, subscribers: int, messages: int, profile: str | None = None) -> dict:
    port = int(upstream.rsplit(":", 1)[1].split("/")[0])
    beam = beam_pid(port)
    topic = f"fanb{uuid.uuid4().hex[:8]}"
    address = f"/topic/{topic}"
    proxy = None
    try:
        if mode == "daemon":
            proxy, pport, _log = start_proxy(upstream, profile)
            sub_url = f"amqp://127.0.0.1:{pport}"
        else:
            sub_url = upstream
        ctx = mp.get_context("spawn")
        ready, out_q = ctx.Event(), ctx.Queue()
        p = ctx.Process(target=subscribers_proc, args=(sub_url, address, subscribers, mode == "direct", messages,
                                                       ready, out_q))
        p.start()
        if not ready.wait(600):
            raise RuntimeError("subscribers did not attach")
        time.sleep(2.0)
        queues = topic_queues(port, topic)
        # RabbitMQ's idle CPU rate (shared node), then the run
        b0, w0 = cpu_seconds(beam), time.time()
        dd0 = cpu_seconds(proxy.pid) if proxy else 0.0
        time.sleep(3.0)
        idle_rate = (cpu_seconds(beam) - b0) / (time.time() - w0)
        daemon_idle = ((cpu_seconds(proxy.pid) if proxy else 0.0) - dd0) / (time.time() - w0)
        d0 = cpu_seconds(proxy.pid) if proxy else 0.0
        b1 = cpu_seconds(beam)
        t0 = publish(upstream, address, messages, subscribers)
        result = out_q.get(timeout=900)
        t1 = time.time() - 15 if result["t"] is None else max(result["t"], t0)
        wall = time.time() - t0
        d1 = cpu_seconds(proxy.pid) if proxy else 0.0
        beam_raw = cpu_seconds(beam) - b1
        p.join(30)
        return {
            "mode": mode, "subscribers": subscribers, "messages": messages, "upstream_queues": queues,
            "selected": result["selected"], "copies": result["copies"], "wrong": result["wrong"],
            "seconds": round(t1 - t0, 2),
            "daemon_us_per_msg": round((d1 - d0) / messages * 1e6, 1) if proxy else None,
            "daemon_idle_cpu": round(daemon_idle, 3),
            "wall": round(wall, 2),
            "rabbitmq_us_per_msg": round(beam_raw / messages * 1e6, 1),
            "rabbitmq_net_us_per_msg": round((beam_raw - idle_rate * wall) / messages * 1e6, 1),
            "rabbitmq_idle_cpu": round(idle_rate, 3),
        }
    finally:
        if proxy is not None:
            proxy.send_signal(signal.SIGINT if profile else signal.SIGTERM)
            proxy.wait(30)
        delete_topic_queues(port, topic)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", default="amqp://guest:guest@127.0.0.1:5672")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--subscribers", default="1,100,1000,10000")
    ap.add_argument("--direct-max", type=int, default=1000)
    ap.add_argument("--profile", help="write a cProfile of the daemon's last run to this file")
    ap.add_argument("--direct-copies", type=int, default=200_000,
                    help="at most this many copies per direct run (fewer messages at many subscribers)")
    args = ap.parse_args()
    rows = []
    for s in [int(x) for x in args.subscribers.split(",")]:
        rows.append(run("daemon", args.upstream, s, args.messages, args.profile))
        print(json.dumps(rows[-1]), flush=True)
        if s <= args.direct_max:
            n = max(100, min(args.messages, args.direct_copies // s))
            rows.append(run("direct", args.upstream, s, n))
            print(json.dumps(rows[-1]), flush=True)
    base = next(r for r in rows if r["mode"] == "daemon")
    for r in rows:
        if r["mode"] == "daemon":
            r["daemon_vs_1"] = round(r["daemon_us_per_msg"] / base["daemon_us_per_msg"], 2)
    print("| mode | subscribers | messages | upstream queues | selected | copies to the client | daemon µs CPU/msg | "
          "RabbitMQ µs CPU/msg (net) | RabbitMQ idle cores | daemon vs 1 subscriber |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['subscribers']:,} | {r['messages']:,} | {r['upstream_queues']:,} | {r['selected']:,} | "
              f"{r['copies']:,} | {r['daemon_us_per_msg'] if r['daemon_us_per_msg'] is not None else '—'} | "
              f"{r['rabbitmq_us_per_msg']} ({r['rabbitmq_net_us_per_msg']}) | {r['rabbitmq_idle_cpu']} | "
              f"{r.get('daemon_vs_1', '—')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
