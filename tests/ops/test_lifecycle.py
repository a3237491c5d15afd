"""`GracefulShutdown` in process, on the engine loop: a request from another thread or a signal
reaches the loop at once (`EventLoop.call_soon_threadsafe`), the drain polls on the loop's timers,
and a second signal unwinds the loop (`Forced`).  The daemon's own SIGTERM tests are in
test_daemon.py."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from broker_filter.engine.container import EngineContainer
from broker_filter.proxy.lifecycle import ConnectionRegistry, Forced, GracefulShutdown


def shutdown_on(container: EngineContainer, in_flight, grace_period: float = 5.0,
                stopped_accepting=lambda: None) -> tuple[GracefulShutdown, list]:
    steps: list = []

    def stop_accepting() -> None:
        steps.append("stop accepting")
        stopped_accepting()

    shutdown = GracefulShutdown(
        container, ConnectionRegistry(None), grace_period=grace_period, in_flight=in_flight,
        stop_accepting=stop_accepting, before_stop=lambda: steps.append("before stop"))
    return shutdown, steps


def test_a_request_from_another_thread_drains_then_stops_the_loop():
    container = EngineContainer()
    done_at = time.monotonic() + 0.3
    shutdown, steps = shutdown_on(container, lambda: 1 if time.monotonic() < done_at else 0)
    threading.Timer(0.05, shutdown.request).start()
    container.loop.call_later(10, container.stop)  # a guard
    started = time.monotonic()
    container.run()
    elapsed = time.monotonic() - started
    assert shutdown.finished and shutdown.requested_by == signal.SIGTERM
    assert steps == ["stop accepting", "before stop"]
    assert 0.25 < elapsed < 1.5  # it waited for the delivery in flight, polling (not the 10 s guard)
    shutdown.request()  # after the loop closed: nothing to wake, nothing raised


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
def test_a_signal_wakes_a_loop_waiting_in_its_poll_and_a_second_signal_forces():
    """The signals come from another thread while the loop waits in its poll (nothing else would
    wake it for 10 s): the first begins the drain at once, the second unwinds the loop."""
    container = EngineContainer()
    times: dict = {}

    def kill(name: str) -> None:
        times[name] = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR1)

    def began() -> None:
        times["began"] = time.monotonic()
        threading.Timer(0.05, kill, ("second",)).start()

    shutdown, steps = shutdown_on(container, lambda: 1, grace_period=60, stopped_accepting=began)
    shutdown.install((signal.SIGUSR1,))
    try:
        threading.Timer(0.05, kill, ("first",)).start()
        container.loop.call_later(10, container.stop)  # a guard
        started = time.monotonic()
        with pytest.raises(Forced) as forced:
            container.run()
    finally:
        shutdown.uninstall()
    assert forced.value.signum == signal.SIGUSR1
    assert steps == ["stop accepting"] and not shutdown.finished
    assert times["began"] - times["first"] < 0.5
    assert time.monotonic() - started < 2.0
    shutdown.request()  # the loop is closed: its wake-up pipe is not written
