"""The proxy's event loop as upstreams see it (`upstream.Loop`), on top of the engine loop's
`EngineContainer` (the subset of proton's Container API the daemon uses).

Theory of operation
-------------------
`call_soon` work runs when the loop has handled every event it has (its `reactor_quiesced`
event), just before it would wait in its poll for sockets and timers.  Work queued while events are
being handled therefore runs at the end of the same turn.  A zero-delay timer would
fire only after the next poll, so each link of a chain of callbacks (the embedded broker
settles, publishes and dispatches through `call_soon`) would wait for a round of socket I/O.

What a round of work queues runs in the next round.  Rounds repeat while the work produces no
engine events; once it does, proton handles those first (frames are built, deliveries processed)
and the next quiesced event runs the rest.  The loop reads and writes sockets only around its poll, so
after `MAX_ROUNDS` rounds without one the loop stops running work and arms a zero-delay timer: the
next poll does not block, and work resumes once that timer fired.  A busy chain of callbacks
therefore cannot starve the sockets, and queued work never waits for a blocking poll.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable

from proton import Handler

log = logging.getLogger("broker_filter.proxy")

MAX_ROUNDS = 16


class _Timer:
    __slots__ = ("_fn", "_task", "cancelled")

    def __init__(self, fn: Callable[[], None]):
        self._fn = fn
        self._task = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self._task is not None:
            self._task.cancel()

    def on_timer_task(self, event) -> None:
        if not self.cancelled:
            _guarded(self._fn)


def _guarded(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # one failing callback must not unwind the container
        log.exception("callback %r failed", fn)


class _Nudge:
    """A zero-delay timer: keeps `select` from blocking, and marks that socket I/O has happened."""

    __slots__ = ("loop",)

    def __init__(self, loop: "ProtonLoop"):
        self.loop = loop

    def on_timer_task(self, event) -> None:
        self.loop._nudge = None
        self.loop._streak = 0


class ProtonLoop(Handler):
    """call_soon / call_later on the event loop's thread (see the module docstring)."""

    def __init__(self, container):
        super().__init__()
        self.container = container
        self._soon: deque[Callable[[], None]] = deque()
        self._nudge = None
        self._streak = 0  # rounds run since proton last had a chance to do socket I/O
        self.rounds = 0  # rounds of call_soon work run (for tests and benchmarks)
        container.handler.add(self)

    def call_soon(self, fn: Callable[[], None]) -> None:
        self._soon.append(fn)

    def on_reactor_quiesced(self, event) -> None:
        soon = self._soon
        if not soon:
            self._streak = 0  # proton selects next
            return
        if self._nudge is not None:
            return  # socket I/O first
        container = self.container
        while soon:
            if self._streak >= MAX_ROUNDS:
                self._nudge = container.schedule(0, _Nudge(self))
                return
            self._streak += 1
            self.rounds += 1
            # Run only what is queued now; what these callbacks queue runs in the next round.
            for _ in range(len(soon)):
                _guarded(soon.popleft())
            if not container.quiesced:
                return  # engine events first; the next quiesced event runs the rest
        self._streak = 0  # nothing left: proton selects next

    def call_later(self, delay: float, fn: Callable[[], None]) -> _Timer:
        timer = _Timer(fn)
        timer._task = self.container.schedule(max(0.0, delay), timer)
        return timer
