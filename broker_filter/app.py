"""Composition root: builds the daemon from a `Config` and runs it.

    App(config).run()   # blocks until SIGINT/SIGTERM; returns the exit status

Parts: the event loop (`engine.container.EngineContainer`, proton-c's engine on an epoll loop; the
proton `Container` is never imported), the upstream (remote broker or embedded), the client-facing `ProxyServer` on the configured listener, and optionally the metrics
exporter, which receives a snapshot of the proxy's state once a second.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import socket
from typing import Any

from .engine.container import EngineContainer, client_ssl_context
from .engine.container import listen as engine_listen
from .filters.parser import prepare as prepare_selectors
from .proxy.loop import EngineLoop
from .workers import worker_index
from .proxy.remote import RemoteUpstream
from .proxy import reports
from .proxy.server import ProxyServer

log = logging.getLogger("broker_filter.app")
# With `replicas.splice`: the bytes of a client connection's first AMQP input kept while it may still
# be spliced to a queue's owner (its open, begin and first attach; a bigger start is served here)
SPLICE_INPUT = 64 * 1024


def build_upstream(config: Any) -> Any:
    up = config.upstream
    if up.urls:
        kinds = None
        if up.evaluates_selectors is True:
            kinds = frozenset({"selector"})
        elif up.evaluates_selectors is False:
            kinds = frozenset()
        urls = []
        for url in up.urls:
            if up.user and "@" not in url.split("://", 1)[-1]:
                from urllib.parse import quote

                scheme, rest = url.split("://", 1)
                url = f"{scheme}://{quote(up.user, safe='')}:{quote(up.password, safe='')}@{rest}"
            urls.append(url)
        rc = up.reconnect
        return RemoteUpstream(
            urls,
            pushdown_kinds=kinds,
            backoff=lambda attempt: rc.delay(attempt, random.random()),
            heartbeat=up.heartbeat or None,
            answer_timeout=up.answer_timeout,
            management_url=up.management_url,
        )
    from .proxy.embedded import EmbeddedUpstream

    return EmbeddedUpstream.from_config(config.embedded)


def listener_users(config: Any) -> dict[str, str]:
    """The PLAIN users the listener checks: `listener.users` and, with `[replicas]` on, the replicas'
    own login.  `replicas.user` needs no entry there: when it has none, it is added with a hash made
    here, at start, from `replicas.password` (so a deployment's configuration carries no hash of it).
    When `listener.users` names it too, that entry's hash wins (the configuration check has made sure
    `replicas.password` matches it)."""
    from .security import hash_password

    users = dict(config.listener.users)
    replicas = config.replicas
    if replicas.enabled and replicas.user and replicas.user not in users and replicas.password:
        users[replicas.user] = hash_password(replicas.password)
    return users


class StartError(Exception):
    """A socket the configuration names cannot be opened (the message names the setting)."""


class App:
    def __init__(self, config: Any, *, instance: str | None = None, args: Any = None):
        self.config = config
        self.args = args  # the command line the configuration was read with (read again on SIGHUP)
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}"
        secure = any(u.startswith("amqps:") for u in config.upstream.urls)
        self.container = EngineContainer(self.instance, client_tls=client_ssl_context(config.upstream.tls) if secure else None)
        self.worker = worker_index()
        if self.worker is not None:  # one of `listener.workers`: the port is shared (broker_filter.workers)
            self.container.loop.reuse_port = True
        self.loop = EngineLoop(self.container)
        self.journal = None
        if config.journal.enabled:  # pyarrow (the [journal] extra) is imported only then
            from .archive.journal import Journal

            self.journal = Journal.from_config(config.journal)
        self.upstream = self._journaled(build_upstream(config))
        self.metrics = None
        self.health = None
        if config.metrics.enabled:
            from .metrics import Metrics

            self.metrics = Metrics(address_labels=config.metrics.address_labels)
        self.server = ProxyServer(
            self.upstream,
            instance=self.instance,
            window=max(1, config.limits.upstream_window),
            config=config,
            metrics=self.metrics,
        )
        self.replicas = None
        if config.replicas.enabled:  # one owner per queue among the replicas (proxy/replicas.py)
            from .proxy.replicas import Replicas

            from .security import replica_ssl_context

            tls = replica_ssl_context(config.replicas.tls, config.listener.tls) if config.listener.tls.enabled else None
            self.replicas = Replicas(config.replicas, self.server, tls=tls)
            self.server.replicas = self.replicas
        self.acceptor = None
        self.port: int | None = None
        self.exporter = None
        self._stopping = False

    def start(self) -> None:
        """Bind the listener and start connecting upstream (the loop runs in `run`)."""
        from .proxy.lifecycle import ConnectionRegistry

        host = self.config.listener.host
        listener = dataclasses.replace(self.config.listener, users=listener_users(self.config))
        handler, check = self.server, None
        if self.config.upstream.credentials == "pass-through":
            # Each client's PLAIN credentials: checked against the upstream, then its own upstream connection.
            from .proxy.passthrough import PassThrough

            self.passthrough = PassThrough(self.server, self._tenant_server,
                                           lambda upstream, listener: upstream.start(self.loop, listener),
                                           self.loop.call_later, abort=self.container.abort,
                                           on_login_failure=self.metrics.login_failed if self.metrics else None)
            handler = self.passthrough
            from .engine.container import UpstreamLogin  # one more connection of the loop

            check = UpstreamLogin(self.container, self.config.upstream.urls)
        # SASL (PLAIN users, EXTERNAL, the anonymous policy) and TLS as configured in [listener].
        self.registry = ConnectionRegistry(handler)
        try:
            self.acceptor = engine_listen(self.container, listener, self.registry, passthrough=check,
                                          max_connections=self.config.limits.connections,
                                          handshake_timeout=self.config.limits.handshake_timeout,
                                          on_refused=self._refused,
                                          on_login_failure=self.metrics.login_failed if self.metrics else None,
                                          known_users=tuple(self.config.security.roles),
                                          keep_first_input=SPLICE_INPUT if self.config.replicas.splice else 0)
        except OSError as e:
            raise StartError(f"listener: cannot listen on {host}:{self.config.listener.port}: "
                             f"{e.strerror or e}") from None
        self.port = self.acceptor.port
        self.upstream.start(self.loop, self.server)
        if self.replicas is not None:
            self.replicas.start(self.loop)
        log.info("listening on %s:%s, upstream %s, instance %s", host, self.port, self.upstream.name,
                 self.instance)
        from .authorization import open_warning

        warning = open_warning(self.config)
        if warning is not None:
            log.warning("%s", warning)
        if self.config.metrics.enabled:
            self._start_metrics()

    def _start_metrics(self) -> None:
        from .metrics import Health, serve_http

        self.health = Health(self.metrics)
        port = self.config.metrics.port
        if port and self.worker is not None:  # one exporter per worker: the configured port + its index
            port += self.worker
        settings = self.config.metrics
        try:
            from .proxy.introspect import LinksEndpoint

            self.metrics.links = LinksEndpoint(self.container.loop.call_soon_threadsafe,
                                               lambda: self._links_report(settings.links_limit))
            self.exporter = serve_http(self.metrics, self.health, settings.host, port, settings)
        except OSError as e:
            from .config import DEFAULT_METRICS_LISTEN

            if settings.listen != DEFAULT_METRICS_LISTEN:
                raise StartError(f"metrics.listen: cannot listen on {settings.host}:{port}: "
                                 f"{e.strerror or e}") from None
            # The default (loopback) address: another daemon on this host may hold it.  Serve without.
            log.warning("metrics.listen: cannot listen on %s:%s (the default): %s; serving without the metrics "
                        "and health endpoints (set metrics.listen to choose an address, or empty to say none)",
                        settings.host, port, e.strerror or e)
            self.metrics.links = None
            return
        self.loop.call_later(self.config.metrics.snapshot_interval, self._publish_snapshot)

    def _install_reload(self) -> None:
        """SIGHUP reads the configuration again: its users, roles and security settings (`reload`)."""
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, lambda signum, frame: self.container.loop.call_soon_threadsafe(self.reload))

    def reload(self) -> None:
        """On the loop's thread: take the file's `[security]` roles and settings (`config.reload_security`);
        links no longer permitted are detached, connections stay.  An error keeps the old settings."""
        import os

        from .config import reload_security

        reloaded = reload_security(self.config, self.args, os.environ)
        if reloaded.config is None:
            log.error("configuration reload refused, the running settings stay: %s", reloaded.error)
            return
        if reloaded.ignored:
            log.warning("configuration reload: %s changed and need a restart to apply", ", ".join(reloaded.ignored))
        self.config = reloaded.config
        users = getattr(self.acceptor, "users", None)
        if users is not None:  # (a listener started without PLAIN users takes users only at a restart)
            users.replace(listener_users(self.config))
        elif self.config.listener.users:
            log.warning("configuration reload: listener.users are taken at the next restart (the listener was "
                        "started without PLAIN users)")
        detached = sum(server.guard.recheck(self.config) for server in self._servers())
        log.info("configuration reloaded: %d security settings, %d users with roles; %d link(s) no longer "
                 "permitted detached", len(self.config.security.settings), len(self.config.security.roles), detached)

    def _servers(self) -> list:
        """The proxy servers of this daemon (with pass-through logins: the default and each tenant's)."""
        passthrough = getattr(self, "passthrough", None)
        if passthrough is None:
            return [self.server]
        return [passthrough.default] + [t.server for t in list(passthrough._tenants.values())]

    def _links_report(self, limit: int | None = None) -> dict:
        """`GET /links`: every server's links, at most `limit` (made on the loop's thread)."""
        from .proxy.introspect import LINKS_LIMIT

        limit = LINKS_LIMIT if limit is None else min(limit, LINKS_LIMIT)
        links: list = []
        truncated = False
        for server in self._servers():
            if len(links) >= limit:
                truncated = True
                break
            report = reports.links_report(server, limit - len(links))
            links += report["links"]
            truncated = truncated or report["truncated"]
        return {"instance": self.instance, "upstream": self.server.upstream.name,
                "upstream_connected": self.server.upstream_up,
                "upstream_version": getattr(self.server.upstream, "version", None),  # (clients may be shown another)
                "links": links, "truncated": truncated}

    def _filter_stats(self) -> tuple[dict, tuple]:
        top = self.config.metrics.costliest_filters
        totals: dict = {}
        costliest: list = []
        for server in self._servers():
            t, c = reports.filter_stats(server, top)
            for key, values in t.items():
                have = totals.get(key)
                totals[key] = values if have is None else tuple(a + b for a, b in zip(have, values))
            costliest += c
        return totals, tuple(costliest[:top])

    def _publish_snapshot(self) -> None:
        from .metrics import Snapshot

        passthrough = getattr(self, "passthrough", None)
        snap = passthrough.snapshot() if passthrough is not None else reports.snapshot(self.server)
        held: dict[str, int] = {}
        stalled: dict[str, bool] = {}
        moving: dict[str, int] = {}
        passes: dict[str, int] = {}
        handed_back: dict[str, int] = {}
        waited: dict[str, float] = {}
        filters, costliest = self._filter_stats()
        for f in snap["feeds"]:
            a = f["address"] or ""
            held[a] = held.get(a, 0) + f["held"]
            stalled[a] = stalled.get(a, False) or f["starved"] > 0
            moving[a] = moving.get(a, 0) + f.get("moving", 0)
            passes[a] = passes.get(a, 0) + f.get("passes", 0)
            handed_back[a] = handed_back.get(a, 0) + f.get("handed_back", 0)
            waited[a] = max(waited.get(a, 0.0), f.get("waited", 0.0))
        self.metrics.publish(Snapshot(connections=snap["connections"], links=snap["links"], held=held,
                                      credit=snap["credit"], stalled=stalled, moving=moving, passes=passes,
                                      handed_back=handed_back, waited=waited,
                                      filters=filters, costliest=costliest,
                                      upstream_connected=snap["upstream_connected"],
                                      spliced=len(self.container.loop.splices)))
        if self.health is not None:
            self.health.beat()
        draining = getattr(self, "shutdown", None) is not None and self.shutdown.requested_by is not None
        if self.health is not None and not self._stopping and not draining:
            self.health.set_ready(bool(snap["upstream_connected"]), "" if snap["upstream_connected"] else "upstream down")
        if not self._stopping:
            self.loop.call_later(self.config.metrics.snapshot_interval, self._publish_snapshot)

    def run(self) -> int:
        """Run until stopped.  SIGTERM / SIGINT drain gracefully (exit 0); a second signal forces."""
        from .proxy.lifecycle import Forced, GracefulShutdown

        if self.acceptor is None:
            self.start()
        shutdown = GracefulShutdown(
            self.container, self.registry,
            grace_period=self.config.shutdown.grace_period,
            in_flight=self._in_flight,
            stop_accepting=self._stop_accepting,
            before_stop=self._before_stop,
            upstream_closing=self._upstream_closing,
            health=getattr(self, "health", None),
        )
        self.shutdown = shutdown
        shutdown.install()
        self._install_reload()
        prepare_selectors(self.server.dialect)  # (before the collector's freeze: the tables live as long)
        _settle_garbage_collector()
        status = 0
        try:
            self.container.run()
        except Forced as e:
            log.warning("second signal: stopping at once")
            status = 128 + e.signum
        except KeyboardInterrupt:
            log.info("stopping")
        finally:
            shutdown.uninstall()
            self._stopping = True
            self.close()
        return status

    def _before_stop(self) -> None:
        self._stopping = True
        if getattr(self, "passthrough", None) is not None:
            self.passthrough.stop()
        if self.replicas is not None:
            self.replicas.stop()
        self.server.registry.end_subscription_queues()  # (before the upstream connection closes)
        self.upstream.stop()

    def _refused(self, reason: str, mechanism: str) -> None:
        """A client the listener turned away (SASL refused, over the limit, handshake too slow)."""
        if self.metrics is None:
            return
        if reason == "unauthorized":
            self.metrics.authentication_failed(mechanism or "none")
        self.metrics.refuse_connection(reason)

    def _tenant_server(self, user: str, password: str, n: int, vhost: str | None = None) -> tuple[Any, Any]:
        """A ProxyServer and its upstream logged in as one pass-through client identity, opening
        `vhost` (None: the upstream URL's own)."""
        import dataclasses
        from urllib.parse import quote, urlsplit, urlunsplit

        up = self.config.upstream

        def login_free(url: str) -> str:
            parts = urlsplit(url)
            parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
            return urlunsplit(parts._replace(path="/" + quote(vhost, safe="")) if vhost is not None else parts)

        bare = tuple(login_free(u) for u in up.urls)
        config = dataclasses.replace(self.config, upstream=dataclasses.replace(up, urls=bare, user=user,
                                                                                 password=password))
        upstream = self._journaled(build_upstream(config))
        server = ProxyServer(upstream, instance=f"{self.instance}~{n}", window=max(1, self.config.limits.upstream_window),
                             config=self.config, metrics=self.metrics)
        return server, upstream

    def _stop_accepting(self) -> None:
        """Shutdown begins: no new connections, and no queue feed starts a move, pulls or sends."""
        self.acceptor.stop_accepting()
        if self.replicas is not None:
            self.replicas.stopping = True  # owns nothing now (its links detach; the others take over)
        self.server.registry.quiesce()
        if getattr(self, "passthrough", None) is not None:
            self.passthrough.quiesce()  # every pass-through tenant's server too

    def _upstream_closing(self) -> bool:
        """An upstream stopped at shutdown (the default one, a pass-through tenant's) still closes."""
        passthrough = getattr(self, "passthrough", None)
        return bool(getattr(self.upstream, "closing", lambda: False)()) or (
            passthrough is not None and passthrough.closing()) or (
            self.replicas is not None and self.replicas.closing())

    def _in_flight(self) -> int:
        """Deliveries sent to clients and not settled, client publishes not yet settled upstream,
        and moves to a queue's tail not yet confirmed (their originals are accepted once they are)."""
        n = self.server.registry.moves_in_flight()
        if getattr(self, "passthrough", None) is not None:
            n += self.passthrough.moves_in_flight()
        for conn in list(self.registry.connections):
            for session in list(conn.sessions):
                for link in list(session.links):
                    state = link.context  # the proxy's record of the link (records.ClientLink)
                    if state is None:
                        continue
                    if state.outlet is not None:
                        n += len(state.outlet.in_flight)
                    if state.inlet is not None:
                        n += state.inlet.unsettled
        return n

    def _journaled(self, upstream: Any) -> Any:
        """The upstream, journaling accepted client publishes when [journal] is enabled."""
        if self.journal is None:
            return upstream
        from .proxy.journaling import JournalingUpstream

        return JournalingUpstream(upstream, self.journal)

    def close(self) -> None:
        if self.replicas is not None:
            try:
                self.replicas.stop()
            except Exception:
                log.exception("stopping the replica connections failed")
        try:
            self.upstream.stop()
        except Exception:
            log.exception("stopping the upstream failed")
        if self.journal is not None:
            if not self.journal.close(timeout=30.0):
                log.warning("journal: not every recorded message was written before shutdown")
        if self.acceptor is not None:
            self.acceptor.close()
        if self.exporter is not None:
            self.exporter.close()


def _settle_garbage_collector() -> None:
    """Before serving: what start-up made (modules, grammars, configuration) is moved out of every
    later collection (`gc.freeze`), so a full collection while serving scans what serving made, not
    the whole interpreter (measured relaying 120,000 messages: full collections of 41 ms each became
    about 5 ms, and the collector's time fell by half).  The thresholds stay CPython's: collecting
    the young generation less often let a round of a thousand links leave its garbage for longer,
    and RSS grew with it."""
    import gc

    gc.collect()
    gc.freeze()
