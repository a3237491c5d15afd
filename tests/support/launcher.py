"""`broker-filter serve` for the tests: one launcher for every folder, the daemon in-process for tests
that read its embedded broker, and the small HTTP and port helpers that go with a running daemon."""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LISTENING = r"listening on [^\s]+:(\d+)"
METRICS = r"metrics and health endpoints on (http://[^ ]+?) "
CONNECTED = "connected ("  # the upstream connection is open (proxy/remote.py logs it)

RUNNING: set = set()  # every Daemon not yet stopped (tests/conftest.py stops leftovers at the end)


class Daemon:
    """A `broker-filter serve` subprocess, its output in a log file.

    `args` are serve's options; `--listen 127.0.0.1:0` comes first unless `listen` says otherwise, and
    the port is read from the daemon's "listening on" line.  `upstream` adds `--upstream URL` and then
    waits for the upstream connection too (`ready`: any other log text to wait for); `config` is a
    TOML text given as `--config FILE`.  `program` is what runs serve (default: this Python's
    `-m broker_filter serve`; the console script, scripts/serve.sh, ...); `env` adds variables to
    this process's environment, or to a user's shell's (`user_env`) when `as_user` is true.

    `stop()` sends SIGTERM, kills after `timeout` seconds, and returns the exit status; a daemon that
    fails to start is stopped before the error is raised."""

    def __init__(self, *args: str, upstream: str | None = None, config: str | None = None,
                 listen: str | None = "127.0.0.1:0", ready: str = "", program: list[str] | None = None,
                 env: dict[str, str] | None = None, as_user: bool = False, cwd: Path = ROOT,
                 start_timeout: float = 30, log_dir: Path | None = None):
        log = tempfile.NamedTemporaryFile("w+", prefix="broker-filter-", suffix=".log", delete=False,
                                          dir=log_dir)
        self.log_path = Path(log.name)
        if log_dir is None:
            atexit.register(self.log_path.unlink, missing_ok=True)
        self._log = log
        self.config_path: Path | None = None
        cmd = list(program or [sys.executable, "-m", "broker_filter", "serve"])
        if listen is not None:
            cmd += ["--listen", listen]
        if config is not None:
            self.config_path = self.log_path.with_suffix(".toml")
            self.config_path.write_text(config)
            cmd += ["--config", str(self.config_path)]
        cmd += args
        if upstream is not None:
            cmd += ["--upstream", upstream]
            ready = ready or CONNECTED
        base = user_env() if as_user else dict(os.environ)
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env={**base, **(env or {})})
        RUNNING.add(self)
        try:
            self.port = int(self.wait_for(LISTENING, start_timeout))
            if ready:
                self.wait_for(re.escape(ready), start_timeout)
        except BaseException:
            self.stop()  # never leave a daemon behind a failed start
            raise
        self.url = f"amqp://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, pattern: str, timeout: float = 30) -> str:
        """`pattern`'s first group (its whole match if it has none) once it is in the log; fails if
        the daemon exits first."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.log())
            if match:
                return match.group(1 if match.re.groups else 0)
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with status {self.proc.returncode} before "
                                   f"{pattern!r} was in its log:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pattern!r} not in the daemon's log after {timeout:.0f} s:\n{self.log()}")
            time.sleep(0.05)

    def metrics_url(self, timeout: float = 30) -> str:
        """The metrics and health endpoints' base URL (the daemon ran with --metrics)."""
        return self.wait_for(METRICS, timeout)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, a kill after `timeout` seconds; the exit status.  Safe to call twice."""
        RUNNING.discard(self)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if not self._log.closed:
            self._log.close()
            if self.config_path is not None:
                self.config_path.unlink(missing_ok=True)
        return self.proc.returncode


def stop_all() -> None:
    """Stop every daemon a failed test left running."""
    for daemon in list(RUNNING):
        daemon.stop()


class InProcessDaemon:
    """The daemon (`broker_filter.app.App`) on a thread of this process, so tests can read its
    embedded broker's counters."""

    def __init__(self, *args: str):
        import argparse
        import threading

        from broker_filter.app import App
        from broker_filter.config import add_serve_arguments, load

        parser = argparse.ArgumentParser()
        add_serve_arguments(parser)
        self.app = App(load(parser.parse_args(["--listen", "127.0.0.1:0", *args]), environ={}))
        self.app.start()
        self.port = self.app.port
        self.url = f"amqp://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.app.run, name="embedded-daemon", daemon=True)
        self.thread.start()

    @property
    def broker(self):
        return self.app.upstream.broker

    def stop(self) -> None:
        self.app.container.stop()
        self.thread.join(10)


def user_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points Python at this checkout or configures the
    daemon: what a user's shell would have."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("BROKER_FILTER_")}
    return {**env, **extra}


_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A loopback port free now, for a process started later that must be told its port up front.

    A port the kernel picks for `bind(0)` is in the ephemeral range, where any outbound connection
    (a client's, a broker's) may take it before the daemon binds it: a CI run lost a replica so.  So
    the port comes from below that range, at random, never the same twice in one test run."""
    import random

    low, _high = _ephemeral_range()
    floor = 10000 if low > 12000 else 1024
    for _ in range(200):
        port = random.randrange(floor, low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free loopback port below the ephemeral range ({low}) after 200 tries")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_port(port: int, timeout: float, want: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(port) == want:
            return
        time.sleep(0.2)
    raise TimeoutError(f"port {port} {'not accepting' if want else 'still accepting'} after {timeout}s")


def http_get(url: str) -> tuple[int, str]:
    """(status, body), an HTTP error status included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(port: int) -> str:
    """The Prometheus text of the metrics endpoint on `port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric_value(text: str, name: str, **labels) -> float:
    """The sample `name{labels}` of a Prometheus text (0.0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + ("{" + want if want else "")):
            if not want or re.match(re.escape(name) + r"\{" + re.escape(want) + r"[,}]", line):
                return float(line.rsplit(" ", 1)[1])
    return 0.0
