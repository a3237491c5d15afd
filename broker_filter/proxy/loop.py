"""The proxy's event loop as upstreams see it (`upstream.Loop`), on top of a proton Container."""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable

log = logging.getLogger("broker_filter.proxy")


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


class ProtonLoop:
    """call_soon / call_later on a proton Container's thread."""

    def __init__(self, container):
        self.container = container
        self._soon: deque[Callable[[], None]] = deque()
        self._scheduled = False

    def call_soon(self, fn: Callable[[], None]) -> None:
        self._soon.append(fn)
        if not self._scheduled:
            self._scheduled = True
            self.container.schedule(0, self)

    def on_timer_task(self, event) -> None:
        self._scheduled = False
        # Run only what is queued now; what these callbacks queue runs in the next round.
        for _ in range(len(self._soon)):
            _guarded(self._soon.popleft())
        if self._soon and not self._scheduled:
            self._scheduled = True
            self.container.schedule(0, self)

    def call_later(self, delay: float, fn: Callable[[], None]) -> _Timer:
        timer = _Timer(fn)
        timer._task = self.container.schedule(max(0.0, delay), timer)
        return timer
