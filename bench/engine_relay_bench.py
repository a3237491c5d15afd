"""A filtering relay on the engine (`broker_filter.engine`) against RabbitMQ direct, same run.

The relay: a client attaches a receiver with a JMS selector to the relay; the relay opens an
upstream receiver on the same address at RabbitMQ (SASL PLAIN), decodes only the sections the
selector reads (`broker_filter.amqp.decode_message` over the received memoryview), forwards the
selected messages' bytes with the upstream delivery tag reused, and settles upstream with the
client's outcome; messages the selector does not select are accepted upstream (the relay's
consumer does not want them).  Upstream credit is a window topped up in batches; with `--ordered`
(default) upstream settlement follows delivery-id order, which lets proton-c coalesce dispositions.

Each round: a rhea consumer, then a rhea producer of N messages (half = i % 2) to a fresh queue;
  * direct: the consumer reads every message from RabbitMQ and selects half = 1 itself;
  * relay:  the consumer reads through the relay with the selector `half = 1`.
Rate = N / (producer start .. the consumer's last selected message).  Rounds are interleaved.
The relay's CPU (user + system, from /proc) per upstream message is reported for relay rounds.

    python bench/engine_relay_bench.py [--messages 40000] [--rounds 3] [--no-ordered]
    python bench/engine_relay_bench.py --serve [--upstream 127.0.0.1:5672]   (the relay alone)

The daemon itself (`broker-filter serve`, on its engine) takes part with `--targets`: `engine` runs
the consumer through the daemon, `engine-both` the producer too (every message crosses the daemon
twice); their CPU is the daemon's, per upstream message:

    python bench/engine_relay_bench.py --targets direct,relay,engine,engine-both --topic

`--frames` puts a forwarder between the daemon and RabbitMQ that counts the AMQP frames the daemon
sends upstream: disposition and flow frames per upstream message are reported for each daemon round.
`--profile FILE` runs the daemon under cProfile.

`--topic` publishes to a fresh `/topic/<name>` instead of a queue: a selective consumer on a queue
through the daemon leaves the messages it does not select in the queue (moved to its tail, queue
custody), which measures custody rather than I/O; on a topic the daemon drops them.

Needs RabbitMQ with AMQP 1.0 on 127.0.0.1:5672 (guest/guest) and rhea (tests/js/node_modules).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from cpu_usage import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "tests" / "js"
SELECTOR_DESCRIPTORS = {"apache.org:selector-filter:string", 0x0000468C00000004}
_PENDING = object()


# --------------------------------------------------------------------------------------------------
# The relay (runs in its own process with --serve)


def serve(upstream: str, ordered: bool, window: int) -> None:
    from broker_filter.amqp import CodecError, decode_message
    from broker_filter.engine import Condition, Handler, SaslClient, Terminus
    from broker_filter.engine.endpoints import ACCEPTED, MODIFIED, REJECTED, RELEASED
    from broker_filter.engine.loop import EventLoop
    from broker_filter.engine.streams import ServerSasl
    from broker_filter.filters import SelectorError, compile_selector

    up_host, _, up_port = upstream.rpartition(":")
    loop = EventLoop()

    class Feed:
        """One client receiver and its upstream receiver."""

        def __init__(self, client, selector):
            self.client = client
            self.filter = selector
            self.reads = selector.reads if selector is not None else frozenset()
            self.waiting: collections.deque = collections.deque()  # (upstream delivery, bytes)
            self.order: collections.deque = collections.deque()  # upstream deliveries, arrival order
            self.settled = 0
            self.receiver = None
            self.upstream = None

        def on_upstream_message(self, delivery, data) -> None:
            selector = self.filter
            if selector is not None:
                try:
                    selected = selector.matches(decode_message(data, self.reads))
                except CodecError:
                    selected = False
            else:
                selected = True
            if selected:
                delivery.context = _PENDING
                client = self.client
                if not self.waiting and client.credit > 0:
                    client.send(data, tag=delivery.raw_tag).context = delivery
                else:
                    self.waiting.append((delivery, bytes(data)))
            else:
                delivery.context = ACCEPTED
            if ordered:
                self.order.append(delivery)
                if not selected:
                    self._settle_in_order()
            elif not selected:
                self._settle(delivery, ACCEPTED)

        def on_client_flow(self) -> None:
            client = self.client
            waiting = self.waiting
            while waiting and client.credit > 0:
                delivery, data = waiting.popleft()
                client.send(data, tag=delivery.raw_tag).context = delivery

        def on_client_outcome(self, out) -> None:
            delivery = out.context
            state = out.remote_state or RELEASED
            out.settle()
            if ordered:
                delivery.context = state
                self._settle_in_order()
            else:
                self._settle(delivery, state)

        def _settle_in_order(self) -> None:
            order = self.order
            while order and order[0].context is not _PENDING:
                delivery = order.popleft()
                self._settle(delivery, delivery.context)

        def _settle(self, delivery, state) -> None:
            delivery.update(state if state in (ACCEPTED, REJECTED, RELEASED, MODIFIED) else RELEASED)
            self.settled += 1
            if self.settled >= window // 2 and self.receiver is not None:
                self.receiver.flow(self.settled)
                self.settled = 0

        def close(self) -> None:
            if self.upstream is not None:
                if self.receiver is not None:
                    self.receiver.detach()
                self.upstream.close()

    class Upstream(Handler):
        def __init__(self, feed):
            self.feed = feed

        def on_message(self, delivery, data) -> None:
            self.feed.on_upstream_message(delivery, data)

        def on_link_open(self, link) -> None:
            pass

        def on_disconnected(self, connection, error) -> None:
            self.feed.client.close(Condition("amqp:connection:forced",
                                             f"upstream connection lost: {error.description if error else ''}"))

    class Clients(Handler):
        def on_link_open(self, link) -> None:
            if not link.is_sender:
                link.close(Condition("amqp:not-implemented", "this relay only delivers to consumers"))
                return
            source = link.remote_source
            link.set_source(source)
            if source.filter_error:
                link.open()
                link.close(Condition("amqp:decode-error", f"the source filter cannot be read: {source.filter_error}"))
                return
            text = None
            for value in (source.filter or {}).values():
                if getattr(value, "descriptor", None) in SELECTOR_DESCRIPTORS:
                    text = value.value
            try:
                selector = compile_selector(text) if text else None
            except SelectorError as e:
                link.open()
                link.close(Condition("amqp:invalid-field", f"selector: {e}"))
                return
            feed = Feed(link, selector)
            link.context = feed
            link.open()
            upstream = loop.connect(up_host, int(up_port), Handler(), sasl=SaslClient("PLAIN", "guest", "guest"))
            upstream.open(hostname=up_host)
            session = upstream.session()
            session.open()
            receiver = session.receiver(f"relay-{uuid.uuid4()}", source=Terminus(address=source.address),
                                        handler=Upstream(feed))
            receiver.open()
            receiver.flow(window)
            feed.receiver, feed.upstream = receiver, upstream
            upstream.handler = Upstream(feed)

        def on_flow(self, link) -> None:
            if link.context is not None:
                link.context.on_client_flow()

        def on_delivery_update(self, delivery) -> None:
            if delivery.remote_settled or delivery.remote_state:
                delivery.link.context.on_client_outcome(delivery)

        def on_link_close(self, link) -> None:
            if link.context is not None:
                link.context.close()
            super().on_link_close(link)

        def on_disconnected(self, connection, error) -> None:
            for session in connection.sessions:
                for link in session.links:
                    if link.context is not None:
                        link.context.close()

    listener = loop.listen("127.0.0.1", 0, Clients(), sasl=ServerSasl(("ANONYMOUS",), allow_skip=True))
    print(json.dumps({"port": listener.port}), flush=True)
    loop.run()


# --------------------------------------------------------------------------------------------------
# The driver


def node(*args: str) -> subprocess.Popen:
    return subprocess.Popen(["node", "rhea_bench.js", *args], cwd=JS, stdout=subprocess.PIPE, text=True)


def one_round(port: int, address: str, count: int, through_relay: bool, relay_pid: int | None,
              produce_through: bool = False, rate: float | None = None, plain_port: int = 5672) -> dict:
    """One rhea consumer and one rhea producer of `count` messages (at most `rate` a second if
    given): the rate of the stream, the relay's CPU per message, and the latency of the selected
    messages (p50_ms, p99_ms: receive time - send time).  Not `through_relay`, the consumer reads
    every message at `plain_port` (RabbitMQ, or a byte forwarder to it) and selects for itself."""
    if through_relay:
        consumer = node("consume", str(port), address, str(count // 2), "half = 1", "0", "1000", "-", "-")
    else:
        consumer = node("consume", str(plain_port), address, str(count // 2), "-", "1", "1000", "guest", "guest")
    ready = json.loads(consumer.stdout.readline())
    assert ready.get("ready"), ready
    cpu0 = cpu_seconds(relay_pid) if relay_pid else 0.0
    paced = [str(rate)] if rate else []
    if produce_through:
        producer = node("produce", str(port), address, str(count), "-", "-", *paced)
    else:
        producer = node("produce", "5672", address, str(count), "guest", "guest", *paced)
    produced = json.loads(producer.stdout.readline())
    consumed = json.loads(consumer.stdout.readline())
    cpu1 = cpu_seconds(relay_pid) if relay_pid else 0.0
    producer.wait(30)
    consumer.wait(30)
    seconds = (consumed["last"] - produced["t0"]) / 1000
    return {"rate": count / seconds, "cpu_us_per_msg": (cpu1 - cpu0) * 1e6 / count if relay_pid else None,
            "selected": consumed["selected"], "received": consumed["received"],
            "p50_ms": consumed.get("p50_ms"), "p99_ms": consumed.get("p99_ms")}


class FrameCounter:
    """A TCP forwarder to `upstream` that counts the AMQP performatives sent through it (client to
    server direction): `counts[code]`, e.g. 0x15 disposition, 0x13 flow, 0x14 transfer."""

    def __init__(self, upstream: str):
        import socket
        import threading

        host, _, port = upstream.rpartition(":")
        self.target = (host, int(port))
        self.counts: collections.Counter = collections.Counter()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source, target, count: bool) -> None:
        pending = b""
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                target.sendall(data)
                if count:
                    pending = self._count(pending + data)
        except OSError:
            pass
        for s in (source, target):
            try:
                s.shutdown(2)
            except OSError:
                pass

    def _count(self, data: bytes) -> bytes:
        pos = 0
        while True:
            if data[pos:pos + 4] == b"AMQP":
                if len(data) - pos < 8:
                    break
                pos += 8
                continue
            if len(data) - pos < 8:
                break
            size = int.from_bytes(data[pos:pos + 4], "big")
            if len(data) - pos < size:
                break
            body = pos + 4 * data[pos + 4]
            if size > body - pos + 2 and data[body:body + 2] == b"\x00\x53":
                self.counts[data[body + 2]] += 1
            pos += size
        return data[pos:]


def start_daemon(io: str, upstream: str, profile: str | None = None,
                 settings: tuple[str, ...] = (), root: Path = ROOT) -> tuple[subprocess.Popen, int, Path]:
    """`broker-filter serve` in front of RabbitMQ (`io` names the target, "engine"; `settings`:
    `--set` arguments, e.g. "limits.upstream_window=1000"; `root`: the checkout whose code runs):
    the process, its port and its log."""
    import re
    import tempfile
    import time

    log = Path(tempfile.mkstemp(prefix=f"broker-filter-bench-{io}-", suffix=".log")[1])
    with open(log, "w") as out:
        profiler = ["-m", "cProfile", "-o", profile] if profile else []
        proc = subprocess.Popen([sys.executable, *profiler, "-m", "broker_filter", "serve", "--listen",
                                 "127.0.0.1:0", "--upstream", f"amqp://guest:guest@{upstream}",
                                 *(a for kv in settings for a in ("--set", kv))],
                                stdout=out, stderr=subprocess.STDOUT, cwd=root,
                                env={**os.environ, "PYTHONPATH": str(root)})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log.read_text()
        m = re.search(r"listening on [^:]+:(\d+)", text)
        if m and "connected (" in text:
            return proc, int(m.group(1)), log
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"broker-filter serve did not start:\n{log.read_text()[-2000:]}")


def delete_queue(name: str) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from rabbitmq_nodes import rabbitmqctl

    rabbitmqctl("delete_queue", name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--upstream", default="127.0.0.1:5672")
    parser.add_argument("--messages", type=int, default=40000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--no-ordered", dest="ordered", action="store_false")
    parser.add_argument("--topic", action="store_true", help="a fresh /topic/<name> per round instead of a queue")
    parser.add_argument("--profile", metavar="FILE", help="run the daemon under cProfile, statistics to FILE")
    parser.add_argument("--frames", action="store_true",
                        help="count the frames the daemon sends upstream (through a forwarder)")
    parser.add_argument("--targets", default="direct,relay",
                        help="comma-separated: direct, relay, engine, engine-both")
    options = parser.parse_args()
    if options.serve:
        serve(options.upstream, options.ordered, options.window)
        return 0

    targets = [t for t in options.targets.split(",") if t]
    unknown = set(targets) - {"direct", "relay", "engine", "engine-both"}
    if unknown or "direct" not in targets:
        parser.error(f"--targets: direct and any of relay, engine, engine-both "
                     f"(unknown: {', '.join(sorted(unknown)) or 'none'})")
    counter = FrameCounter(options.upstream) if options.frames else None
    servers: dict[str, tuple[subprocess.Popen, int]] = {}  # target -> (process, port)
    logs = []
    queues = []
    results: dict[str, list] = {kind: [] for kind in targets}
    try:
        if "relay" in targets:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            command = [sys.executable, __file__, "--serve", "--upstream", options.upstream,
                       "--window", str(options.window)]
            if not options.ordered:
                command.append("--no-ordered")
            relay = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
            servers["relay"] = (relay, json.loads(relay.stdout.readline())["port"])
        for io in ("engine",):
            if io in targets or f"{io}-both" in targets:
                upstream = f"127.0.0.1:{counter.port}" if counter is not None else options.upstream
                proc, port, log = start_daemon(io, upstream, options.profile)
                logs.append(log)
                servers[io] = servers[f"{io}-both"] = (proc, port)
        for n in range(options.rounds):
            for kind in targets:
                name = f"engine-bench-{uuid.uuid4().hex[:12]}"
                if not options.topic:
                    queues.append(name)
                proc, port = servers.get(kind, (None, 0))
                address = f"/topic/{name}" if options.topic else f"/queue/{name}"
                before = dict(counter.counts) if counter is not None else {}
                result = one_round(port, address, options.messages, proc is not None,
                                   proc.pid if proc is not None else None, kind.endswith("-both"))
                results[kind].append(result)
                extra = f", CPU {result['cpu_us_per_msg']:.1f} us/msg" if proc is not None else ""
                if counter is not None and kind.startswith("engine"):
                    time.sleep(0.5)  # the last dispositions
                    frames = {code: (counter.counts[code] - before.get(code, 0)) / options.messages
                              for code in (0x15, 0x13)}
                    result["dispositions"], result["flows"] = frames[0x15], frames[0x13]
                    extra += f", {frames[0x15]:.3f} dispositions and {frames[0x13]:.3f} flows upstream per message"
                print(f"round {n + 1} {kind:14}: {result['rate']:8.0f} msg/s (selected {result['selected']}, "
                      f"received {result['received']}){extra}", flush=True)
    finally:
        for proc, _ in {id(p): (p, port) for p, port in servers.values()}.values():
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for name in queues:
            delete_queue(name)
        for log in logs:
            log.unlink()
    direct = statistics.median(r["rate"] for r in results["direct"])
    print(f"\nmedian of {options.rounds} interleaved rounds, {options.messages} messages each, "
          f"{'ordered' if options.ordered else 'unordered'} upstream settlement (relay):")
    print(f"  direct {direct:.0f} msg/s")
    for kind in [t for t in targets if t != "direct"]:
        rate = statistics.median(r["rate"] for r in results[kind])
        cpu = statistics.median(r["cpu_us_per_msg"] for r in results[kind])
        frames = ""
        if "dispositions" in results[kind][0]:
            frames = (f"; {statistics.median(r['dispositions'] for r in results[kind]):.3f} disposition, "
                      f"{statistics.median(r['flows'] for r in results[kind]):.3f} flow frames per message")
        print(f"  {kind:14} {rate:8.0f} msg/s: {rate / direct:.2f}x direct; CPU {cpu:.1f} us per upstream message"
              f"{frames}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
