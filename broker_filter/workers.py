"""Several worker processes on one listener port (`listener.workers = N`, `--set listener.workers=N`).

Theory of operation.  With more than one worker, `broker-filter serve` becomes a supervisor.  It
resolves the listener's port (port 0: a free one, which it keeps bound, not listening, so that no
other program takes it) and starts N workers: the same command line with `--set listener.port=PORT`
and the worker's index in `BROKER_FILTER_WORKER`.  Each worker is a whole daemon on the engine: its
own upstream connection, its own listening socket on the shared port (`SO_REUSEPORT`: the kernel
spreads new connections over the workers), its own queue feeds.  A queue's held messages live in
the worker whose client asked for them; queue custody (a held message is moved to the queue's tail)
works across workers as it does across daemons.  The embedded broker (its addresses live in one
process) and the journal (one directory) cannot be shared: `config` refuses them with several
workers.

Signals: SIGTERM or SIGINT to the supervisor is passed to every worker, which drains as a single
daemon does; the supervisor exits 0 once every worker exited 0 (1 otherwise).  A second signal is
passed on too (the workers then stop at once).  A worker that exits while no shutdown is under way
is logged and started again a second later; the supervisor counts the restarts in its log lines.
One that fails five times in a row within seconds of its start (a bad certificate, a port taken)
ends the supervisor: the other workers are drained and it exits 1.

Metrics: with `metrics.listen`, worker i serves its own exporter on the configured port + i (port
0: each on a free port, which it logs); sum the workers' counters for the daemon's.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

log = logging.getLogger("broker_filter.workers")

WORKER_ENV = "BROKER_FILTER_WORKER"
RESTART_DELAY = 1.0
QUICK_EXIT = 5.0  # a worker that exits this soon after its start failed to start
QUICK_EXITS = 5  # so many in a row (one worker) and the supervisor gives up: something is wrong for all
_POLL = 0.2


def worker_index() -> int | None:
    """This process's index among the workers, or None when it is not a worker."""
    value = os.environ.get(WORKER_ENV)
    return int(value) if value and value.isdigit() else None


def _die_with_parent() -> None:
    """In the worker before exec: SIGTERM when the supervisor goes, however it goes (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Supervisor:
    """Starts `config.listener.workers` workers on one port, restarts those that die, drains them all
    on SIGTERM.  `argv`: serve's command line (default: this process's)."""

    def __init__(self, config: Any, argv: list[str] | None = None):
        self.config = config
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.count = config.listener.workers
        self.workers: dict[int, subprocess.Popen] = {}
        self.restarts = 0
        self.stopping: int | None = None
        self._due: dict[int, float] = {}  # index -> when a dead worker starts again
        self._started: dict[int, float] = {}
        self._quick: dict[int, int] = {}  # index -> exits in a row soon after the start
        self.failed = False
        self._reserved: socket.socket | None = None

    def run(self) -> int:
        listener = self.config.listener
        try:
            port = self._reserve(listener.host, listener.port)
        except OSError as e:
            log.error("cannot bind %s:%s: %s", listener.host, listener.port, e.strerror or e)
            return 1
        self.port = port
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for i in range(self.count):
                self._start(i)
            log.info("listening on %s:%s with %d workers", listener.host, port, self.count,
                     extra={"fields": {"workers": self.count}})
            return self._supervise()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if self._reserved is not None:
                self._reserved.close()

    def _reserve(self, host: str, port: int) -> int:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        self._reserved = sock
        return sock.getsockname()[1]

    def _start(self, index: int) -> None:
        cmd = [sys.executable, "-m", "broker_filter", *self.argv, "--set", f"listener.port={self.port}"]
        env = {**os.environ, WORKER_ENV: str(index)}
        self.workers[index] = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)
        self._started[index] = time.monotonic()
        log.info("worker %d started", index, extra={"fields": {"worker": index, "pid": self.workers[index].pid}})

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stopping is None:
            self.stopping = signum
            log.info("shutdown requested: draining %d workers", len(self.workers))
        for proc in self.workers.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

    def _supervise(self) -> int:
        failed = False
        while True:
            if self.failed and self.stopping is None:
                self._on_signal(signal.SIGTERM, None)
            for index, proc in list(self.workers.items()):
                status = proc.poll()
                if status is None:
                    continue
                if self.stopping is not None:
                    failed = failed or status != 0
                    del self.workers[index]
                    continue
                if time.monotonic() - self._started[index] < QUICK_EXIT:
                    self._quick[index] = self._quick.get(index, 0) + 1
                else:
                    self._quick[index] = 0
                if self._quick[index] >= QUICK_EXITS:
                    log.error("worker %d failed %d times in a row at its start; stopping every worker", index,
                              QUICK_EXITS, extra={"fields": {"worker": index, "status": status}})
                    del self.workers[index]
                    self.failed = failed = True
                    continue
                self.restarts += 1
                log.warning("worker %d (pid %d) exited with status %s; starting it again", index, proc.pid,
                            status, extra={"fields": {"worker": index, "status": status,
                                                      "restarts": self.restarts}})
                del self.workers[index]
                self._due[index] = time.monotonic() + RESTART_DELAY
            if self.stopping is not None:
                self._due.clear()
                if not self.workers:
                    log.info("every worker stopped", extra={"fields": {"restarts": self.restarts}})
                    return 1 if failed else 0
            now = time.monotonic()
            for index, due in list(self._due.items()):
                if now >= due:
                    del self._due[index]
                    self._start(index)
            time.sleep(_POLL)
