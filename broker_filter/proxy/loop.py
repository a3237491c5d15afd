"""The proxy's event loop as upstreams see it (`upstream.Loop`): `call_soon` and `call_later` on
the engine's `EventLoop` (`broker_filter.engine.loop`), the loop `broker-filter serve` runs on.

    loop = EngineLoop(container)      # container: engine.container.EngineContainer (`loop.container`)
    loop.call_soon(fn)                # at the end of this turn
    timer = loop.call_later(0.5, fn)  # timer.cancel()

Theory of operation
-------------------
`call_soon` work runs at the end of the engine loop's turn (an `after_turn` callback), once every
event the turn brought is handled, just before the loop polls for sockets and timers again.  Work
queued while events are handled therefore runs in the same turn.  A zero-delay timer would fire only
after the next poll, so each link of a chain of callbacks (the embedded broker settles, publishes
and dispatches through `call_soon`) would wait for a round of socket I/O.

What a round of work queues runs in the next round.  Rounds repeat while the work produces no
engine events; once it does, the engine handles those first (frames are built, deliveries
processed, output written) and then asks for the rest.  The loop reads sockets only at its poll, so
after `MAX_ROUNDS` rounds in a row the loop stops running work and arms a zero-delay timer: a due
timer keeps the next poll from blocking, and the timer fires after that poll, so the rounds resume
once socket I/O has happened.  (The count starts again whenever the queue runs empty.)  A busy
chain of callbacks therefore cannot starve the sockets, and queued work never waits for a blocking
poll: work left at the end of a turn either has that timer armed, or was queued by events the engine
handled after its last `after_turn` call, and then the engine's next poll does not block either
(`EventLoop.run_once`).  (An `after_turn` callback added after this loop's that queued work without
making events would slip through: the daemon adds none.)

A `call_soon` callback that raises is logged and the rest run; `call_later` is the engine's timer
(`Timer.cancel()`), whose failures the engine logs the same way.  Nothing here touches proton's
Python API: the loop is the engine's.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable

from ..engine.endpoints import Timer

log = logging.getLogger("broker_filter.proxy")

MAX_ROUNDS = 16


class EngineLoop:
    """call_soon / call_later on the engine loop's thread (see the module docstring)."""

    def __init__(self, container: Any):
        self.container = container  # the EngineContainer (upstreams connect through it)
        self.engine = engine = container.loop
        self._soon: deque[Callable[[], None]] = deque()
        # `call_soon(fn)`: run fn at the end of this turn (FIFO).  The deque's own append: it is on
        # the per-message path of the embedded broker.
        self.call_soon: Callable[[Callable[[], None]], None] = self._soon.append
        self._streak = 0  # rounds run since the queue was last empty or socket I/O last happened
        self._resume: Timer | None = None  # the zero-delay timer armed after MAX_ROUNDS rounds
        self.rounds = 0  # rounds of call_soon work run (for tests and benchmarks)
        engine.add_after_turn(self._end_of_turn)

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        """Run fn on the loop's thread after `delay` seconds; `.cancel()` on what it returns."""
        return self.engine.call_later(max(0.0, delay), fn)

    def _end_of_turn(self) -> None:
        soon = self._soon
        if not soon:
            self._streak = 0
            return
        if self._resume is not None:
            return  # socket I/O first
        engine = self.engine
        popleft = soon.popleft
        while True:
            if self._streak >= MAX_ROUNDS:
                self._resume = engine.call_later(0.0, self._resumed)
                return
            self._streak += 1
            self.rounds += 1
            # Run only what is queued now; what these callbacks queue runs in the next round.
            for _ in range(len(soon)):
                fn = popleft()
                try:
                    fn()
                except Exception:  # one failing callback must not unwind the loop
                    log.exception("callback %r failed", fn)
            if not soon:
                self._streak = 0  # nothing left: the loop polls next
                return
            if not engine.quiesced:
                return  # engine events first; the engine then asks again for the rest

    def _resumed(self) -> None:
        self._resume = None
        self._streak = 0
