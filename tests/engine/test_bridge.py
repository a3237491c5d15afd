"""The engine's bridge to the daemon's proton handlers hands on only the events they answer
(`engine.container.HANDED_ON`): a handler method for any other proton event would never be called
on the default I/O loop.  This reads every handler class of the daemon and fails on such a method."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import broker_filter.proxy
from broker_filter.engine.container import HANDED_ON

DAEMON_MODULES = ["broker_filter.app"] + [
    f"broker_filter.proxy.{m.name}" for m in pkgutil.iter_modules(broker_filter.proxy.__path__)]


def _connection_event_methods() -> dict[str, int]:
    """on_<name> -> proton event type number, for the events of a connection (not the reactor's
    nor timers': the daemon's timers are the engine loop's own)."""
    from proton._events import EventType

    return {t.method: number for number, t in EventType.TYPES.items()
            if number < 10000 and t.method and t.method != "on_timer_task"}


def test_every_proton_event_a_daemon_handler_answers_is_handed_on():
    methods = _connection_event_methods()
    answered: dict[str, list[str]] = {}
    for name in DAEMON_MODULES:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            for attribute in vars(cls):
                if attribute in methods:
                    answered.setdefault(attribute, []).append(f"{name}.{cls.__name__}")
    missing = {m: where for m, where in answered.items() if methods[m] not in HANDED_ON}
    assert not missing, f"handled by the daemon but not handed on by the engine's bridge: {missing}"
    # the check sees the handlers at all
    assert {"on_delivery", "on_link_flow", "on_connection_remote_open"} <= set(answered)


def test_events_nothing_answers_are_not_handed_on():
    methods = _connection_event_methods()
    for skipped in ("on_transport", "on_link_local_open", "on_link_init", "on_session_final"):
        assert methods[skipped] not in HANDED_ON
