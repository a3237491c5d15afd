"""Replicas for the tests and the benchmark: N `broker-filter serve` processes configured as one set
(`[replicas]`), and a consumer thread that moves to another replica when its own goes."""

from __future__ import annotations

import re
import socket
import threading
import time

from launcher import Daemon, free_port
from rabbitmq_nodes import rabbitmqctl

UP = r"replica {} is up"


def replica_config(peers: list[str], me: str, metrics: str | None = None, heartbeat: float = 2.0,
                   grace: float = 5.0, login: tuple[str, str] | None = None, dns: str | None = None,
                   splice: bool = False, hashed: bool = True) -> str:
    """`[replicas]` (and `[listener.users]` with the one user `login` = (name, password), which the
    replicas log in to each other as too; `hashed=False`: no `[listener.users]`, the listener takes
    the login from `replicas.user` and `replicas.password` alone)."""
    quoted = ", ".join(f'"{p}"' for p in peers)
    members = f'dns = "{dns}"' if dns else f'peers = [{quoted}]'
    text = f'[replicas]\n{members}\nself = "{me}"\nheartbeat = {heartbeat}\n'
    if splice:
        text += "splice = true\n"
    if login is not None:
        from broker_filter.security import hash_password

        text += f'user = "{login[0]}"\npassword = "{login[1]}"\n'
        if hashed:
            text += f'[listener.users]\n{login[0]} = "{hash_password(login[1], algorithm="pbkdf2-sha256")}"\n'
    text += f'[shutdown]\ngrace_period = {grace}\n'
    if metrics:
        text += f'[metrics]\nlisten = "{metrics}"\n'
    return text


class ReplicaSet:
    """`n` replicas on `host` (ports picked free), each with a metrics listener; `start(i)` starts
    replica i (again) on its own port and waits until it sees every other live replica."""

    def __init__(self, upstream: str, n: int, host: str = "127.0.0.1", hosts: list[str] | None = None,
                 program_prefix: list[list[str]] | None = None, login: tuple[str, str] | None = None,
                 upstreams: list[str] | None = None, heartbeat: float = 10.0, dns: str | None = None,
                 splice: bool = False, hashed: bool = True):
        # (a long heartbeat by default: a loaded machine must not make a replica look silent where
        # silence is not what is tested; killed and draining replicas close their connections)
        self.heartbeat = heartbeat
        self.upstreams = upstreams or [upstream] * n
        self.hosts = hosts or [host] * n
        # with `dns` (NAME, each replica on a host of its own): one port for all, as behind a Service
        self.ports = [free_port()] * n if dns else [free_port() for _ in range(n)]
        self.dns = f"{dns}:{self.ports[0]}" if dns else None
        self.metrics_ports = [free_port() for _ in range(n)]
        self.peers = [f"{h}:{p}" for h, p in zip(self.hosts, self.ports)]
        self.daemons: list[Daemon | None] = [None] * n
        self.prefix = program_prefix
        self.login = login
        self.splice = splice  # `replicas.splice`
        self.hashed = hashed  # the login in [listener.users] too (else replicas.user/password alone)

    def start(self, i: int, wait_for: list[int] | None = None) -> Daemon:
        import sys

        program = None
        if self.prefix is not None:
            program = [*self.prefix[i], sys.executable, "-m", "broker_filter", "serve"]
        d = Daemon(upstream=self.upstreams[i], listen=f"{self.hosts[i]}:{self.ports[i]}", program=program,
                   config=replica_config(self.peers, self.peers[i], f"{self.hosts[i]}:{self.metrics_ports[i]}",
                                         login=self.login, heartbeat=self.heartbeat, dns=self.dns,
                                         splice=self.splice, hashed=self.hashed))
        self.daemons[i] = d
        for j in (wait_for if wait_for is not None else self.live()):
            if j != i:
                d.wait_for(re.escape(f"replica {self.peers[j]} is up"), 30)
        return d

    def start_all(self) -> None:
        for i in range(len(self.peers)):
            self.start(i, wait_for=[])
        for i in range(len(self.peers)):
            for j in range(len(self.peers)):
                if i != j:
                    self.daemons[i].wait_for(re.escape(f"replica {self.peers[j]} is up"), 30)

    def live(self) -> list[int]:
        return [i for i, d in enumerate(self.daemons) if d is not None and d.proc.poll() is None]

    def url(self, i: int) -> str:
        login = f"{self.login[0]}:{self.login[1]}@" if self.login else ""
        return f"amqp://{login}{self.peers[i]}"

    def stop_all(self) -> list[str]:
        logs = []
        for d in self.daemons:
            if d is not None:
                d.stop()
                logs.append(d.log())
        return logs


class Consumer(threading.Thread):
    """Receives (accepting) from `address` with `selector` on the replicas at `urls`, the first
    first; when its connection goes it reconnects to the next one.  `got` lists the bodies."""

    def __init__(self, urls: list[str], address: str, selector: str, credit: int = 50):
        super().__init__(daemon=True)
        self.urls = urls
        self.address = address
        self.selector = selector
        self.credit = credit
        self.got: list = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.attached = threading.Event()
        self.reconnects = 0
        self.errors: list[str] = []
        self.changed = threading.Condition(self.lock)

    def count(self) -> int:
        with self.lock:
            return len(self.got)

    def wait_count(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(self.got) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True

    def wait_set(self, wanted: set, timeout: float) -> bool:
        """Until every body of `wanted` came (duplicates aside), at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not wanted <= set(self.got):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True

    def run(self) -> None:
        from proton import Timeout
        from proton.reactor import Selector
        from proton.utils import BlockingConnection

        k = 0
        while not self.stopping.is_set():
            url = self.urls[k % len(self.urls)]
            try:
                conn = BlockingConnection(url, timeout=5)
                try:
                    rcv = conn.create_receiver(self.address, credit=self.credit,
                                               options=Selector(self.selector))
                    self.attached.set()
                    while not self.stopping.is_set():
                        try:
                            m = rcv.receive(timeout=0.3)
                        except Timeout:
                            continue
                        rcv.accept()
                        with self.changed:
                            self.got.append(m.body)
                            self.changed.notify_all()
                finally:
                    try:
                        conn.close()
                    except Exception:
                        pass
            except Exception as e:  # its replica went: the next one
                if self.stopping.is_set():
                    break
                self.errors.append(f"{url}: {e}")
                self.reconnects += 1
                k += 1
                time.sleep(0.2)


class PipelinedConsumer(Consumer):
    """A `Consumer` whose open, begin and attach go out together, as rhea's and proton Container
    clients' do (a `BlockingConnection` waits for the open's answer before it attaches), so that a
    replica with `replicas.splice` can splice its connection to the queue's owner.  When its
    connection goes, proton's reconnect opens it again (the next of `urls`), its link with it; when
    its link is detached with an error, it opens a new connection, to the next of `urls`."""

    def run(self) -> None:
        from proton.handlers import MessagingHandler
        from proton.reactor import Container, Selector

        outer = self

        class Watch:
            def __init__(self, handler):
                self.handler = handler

            def on_timer_task(self, event):
                if outer.stopping.is_set():
                    self.handler.conn.close()
                    event.container.stop()
                else:
                    event.container.schedule(0.1, self)

        class Handler(MessagingHandler):
            def __init__(self):
                super().__init__(prefetch=outer.credit)
                self.conn = None
                self.opened = 0
                self.tried = 0

            def on_start(self, event):
                self.connect(event.container)
                event.container.schedule(0.1, Watch(self))

            def connect(self, container):
                urls = outer.urls[self.tried % len(outer.urls):] + outer.urls[:self.tried % len(outer.urls)]
                self.conn = container.connect(urls=urls, reconnect=[0.2] * 1000)
                container.create_receiver(self.conn, outer.address, options=Selector(outer.selector))

            def on_link_error(self, event):
                # its link detached by the server (a replica that drains): again, on a new connection
                condition = event.link.remote_condition
                outer.errors.append(f"link: {condition.name if condition else ''}")
                old, self.tried = self.conn, self.tried + 1
                old.close()
                self.connect(event.container)

            def on_connection_opened(self, event):
                self.opened += 1
                outer.reconnects = self.opened - 1

            def on_link_opened(self, event):
                outer.attached.set()

            def on_message(self, event):
                with outer.changed:
                    outer.got.append(event.message.body)
                    outer.changed.notify_all()

            def on_transport_error(self, event):
                condition = event.transport.condition
                outer.errors.append(f"{condition.name if condition else 'transport'}: "
                                    f"{condition.description if condition else ''}")

        Container(Handler()).run()


def queue_consumers(name: str, broker=None) -> int | None:
    """RabbitMQ's consumer count of queue `name` (None: not listed): asked of `broker` (a node of
    `rabbitmq_nodes`), else of the node of the parametrised runs."""
    args = ("list_queues", "-q", "name", "consumers")
    out = broker.ctl(*args, timeout=60) if broker is not None else rabbitmqctl(*args)
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            return int(parts[1])
    return None


def wait_consumers(name: str, want: int, timeout: float = 30, broker=None) -> int | None:
    deadline = time.monotonic() + timeout
    n = None
    while time.monotonic() < deadline:
        n = queue_consumers(name, broker)
        if n == want:
            return n
        time.sleep(0.3)
    return n


def parts(start: int, stop: int, n: int = 3) -> list:
    """Messages start..stop-1: message i has the body i and the property part = i % n."""
    from proton import Message

    return [Message(body=i, properties={"part": i % n}) for i in range(start, stop)]


def publish_parts(url: str, q: str, start: int, stop: int, n: int = 3) -> None:
    """`parts(start, stop, n)` published to `q` at `url`, every one accepted."""
    from clients import publish_many

    publish_many(url, q, parts(start, stop, n))


def expected(k: int, start: int, stop: int, n: int = 3) -> set:
    """The bodies consumer k of n gets (selector `part = k`, message i has part i % n)."""
    return {i for i in range(start, stop) if i % n == k}


def all_arrive(consumers: list, upto: int, timeout: float) -> None:
    """Each consumer k has got every message of its part among 0..upto-1 within `timeout` seconds."""
    for k, c in enumerate(consumers):
        assert c.wait_set(expected(k, 0, upto), timeout), f"consumer {k}: {c.count()}; {c.errors}"


def no_more_arrive(consumers: list, upto: int) -> None:
    """A moment later each consumer still has exactly its part of 0..upto-1 (extras would show)."""
    time.sleep(0.5)
    for k, c in enumerate(consumers):
        assert set(c.got) == expected(k, 0, upto), f"consumer {k}"


class Forwarder(threading.Thread):
    """TCP from (host, port) to 127.0.0.1:target, a thread per direction; `close()` stops it."""

    def __init__(self, host: str, target: int, port: int = 0):
        super().__init__(daemon=True)
        self.target = target
        self.server = socket.create_server((host, port))
        self.port = self.server.getsockname()[1]
        self.stopping = False
        self.socks: list[socket.socket] = []

    def run(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopping = True
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.server.close()
        self.join(5)
        for s in self.socks:  # shutdown first: a close alone leaves a socket another thread reads
            for end in (lambda: s.shutdown(socket.SHUT_RDWR), s.close):
                try:
                    end()
                except OSError:
                    pass


def stop_everything(consumers: list, rs: ReplicaSet, forwarder) -> list[str]:
    """The end of a replicas test: its consumers, its replicas and the forwarder in front of the
    broker stopped; returns the replicas' logs."""
    for c in consumers:
        c.stopping.set()
    logs = rs.stop_all()
    forwarder.close()
    return logs


def no_traceback(logs: list[str]) -> None:
    for log in logs:
        assert "Traceback" not in log, log


def start_consumers(rs: ReplicaSet, q: str, moving: bool = True) -> list[Consumer]:
    """Consumer k on replica k with the selector `part = k`, started and attached; `moving`: it goes
    to the next replicas in turn when its own goes, else it stays on its replica."""
    n = len(rs.peers)
    cs = [Consumer([rs.url((k + i) % n) for i in range(n if moving else 1)], q, f"part = {k}") for k in range(n)]
    for c in cs:
        c.start()
    for c in cs:
        assert c.attached.wait(30), c.errors
    return cs
