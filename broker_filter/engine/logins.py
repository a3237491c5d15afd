"""The listener's password checks: a throttle per source address, a bounded queue, a small pool.

Theory of operation.  A PLAIN login costs the daemon a password hash (scrypt or PBKDF2, ~100 ms of
CPU on purpose) or, with pass-through credentials, a login attempt at the upstream broker.  Neither
runs on the event loop, and no client can make the daemon do them faster than it allows:

- Credentials verified recently (`UserDatabase.remembered`: a keyed digest, microseconds) are let in
  at once, with no check queued: a client that reconnects often never waits behind others.
- A source address (the client's IP address) with failed logins has its next check delayed: the
  first failure by `delay`, each further one twice as long up to `max_delay`; its checks then run
  one at a time, each no sooner than that.  Failures are forgotten `forget` seconds after the last
  one.  A login of that address beyond `per_address` waiting ones is refused at once (`throttled`).
  The delay is the address's own: other addresses' logins are not behind it.
- Checks wait in one queue of at most `queue` entries, taken round-robin over the source addresses
  (one address's burst does not make another's login wait behind all of it), and run on `workers`
  threads, of which one address takes at most all but one: another address's check finds a thread
  free (pass-through checks, a connection of the loop each, run up to `queue` at once).  A login
  beyond the queue is refused at once (`queue-full`).  Both refusals answer SASL's `sys-temp`
  outcome (a temporary failure: try again later); the client's connection then closes.
- A client that hangs up while its check waits takes the check out of the queue (nothing is
  computed for it) and counts as a failure of its address; one whose check runs already lets it
  finish, its result feeding the throttle.  Both are logged and counted as `abandoned`.

Failed and abandoned logins are logged through `RateLimitedLog` (at most `log_rate` lines a second;
the number left out is logged with the next line, or a second later) and counted through
`on_failure(reason)` (the daemon's `broker_filter_login_failures_total{reason}`).  Successful logins
are logged at INFO (user, mechanism, remote address), rate-limited as well (ten times the budget).

    gate = LoginGate(users.authenticate, loop, LoginPolicy(), remembered=users.remembered)
    ticket = gate.submit("127.0.0.2", user, password, done)   # done(OK | WRONG | QUEUE_FULL | THROTTLED)
    ticket.cancel()                                          # the client hung up
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any, Callable

log = logging.getLogger("broker_filter.logins")

OK = "ok"
WRONG = "wrong-credentials"
QUEUE_FULL = "queue-full"
THROTTLED = "throttled"
ABANDONED = "abandoned"
REFUSED_FOR_NOW = frozenset({QUEUE_FULL, THROTTLED})


@dataclass(frozen=True)
class LoginPolicy:
    """The gate's settings (`[listener.login]`)."""

    workers: int = 2
    queue: int = 32
    per_address: int = 8
    delay: float = 0.1
    max_delay: float = 5.0
    forget: float = 60.0
    log_rate: int = 10

    @classmethod
    def of(cls, settings: Any) -> LoginPolicy:
        """The policy of an object with the same attributes (`config.ListenerLogin`); None: the defaults."""
        if settings is None or isinstance(settings, LoginPolicy):
            return settings or cls()
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls) if hasattr(settings, f.name)})

    def delay_after(self, failures: int) -> float:
        """Seconds an address waits for its next check after `failures` failures in a row (0: none)."""
        if failures <= 0:
            return 0.0
        return min(self.max_delay, self.delay * 2.0 ** min(failures - 1, 64))


class RateLimitedLog:
    """Log lines at most `per_second` a second; the ones left out are counted, and the count goes
    out with the next line logged (field `suppressed`) or, if none comes, a second later."""

    def __init__(self, logger: logging.Logger, per_second: int, clock: Callable[[], float],
                 call_later: Callable[[float, Callable[[], None]], Any], what: str = "lines"):
        self._log = logger
        self._rate = max(1, per_second)
        self._clock = clock
        self._call_later = call_later
        self._what = what
        self._window = -1.0
        self._count = 0
        self.suppressed = 0  # left out, not reported yet
        self._timer: Any = None

    def __call__(self, level: int, message: str, fields: dict) -> bool:
        """Log `message` (no %-arguments) with `fields` if the budget allows; whether it did."""
        now = self._clock()
        if now - self._window >= 1.0:
            self._window, self._count = now, 0
        if self._count >= self._rate:
            self.suppressed += 1
            if self._timer is None:
                self._timer = self._call_later(1.0, self._flush)
            return False
        self._count += 1
        if self.suppressed:
            fields = {**fields, "suppressed": self.suppressed}
            message = f"{message} ({self.suppressed} more {self._what} left out of the log)"
            self.suppressed = 0
        self._log.log(level, "%s", message, extra={"fields": fields})
        return True

    def _flush(self) -> None:
        self._timer = None
        if self.suppressed:
            n, self.suppressed = self.suppressed, 0
            self._log.warning("%d %s left out of the log (at most %d a second)", n, self._what, self._rate,
                              extra={"fields": {"suppressed": n}})


class Ticket:
    """One PLAIN check: `cancel()` when its client hung up."""

    __slots__ = ("gate", "host", "user", "password", "done", "state", "peer", "mechanism")

    def __init__(self, gate: LoginGate, host: str, user: str, password: str, done: Callable[[str], None],
                 peer: str, mechanism: str):
        self.gate = gate
        self.host = host
        self.user = user
        self.password = password
        self.done = done
        self.peer = peer
        self.mechanism = mechanism
        self.state = "new"  # delayed, queued, running, cancelled (running, its client gone), finished

    def cancel(self, abandoned: bool = True) -> None:
        """Its client is gone (`abandoned`: it hung up; False: the daemon closed it, e.g. its handshake
        time-out, which is counted as such): a check not started yet is never run."""
        self.gate._cancel(self, abandoned)


class _Address:
    """What the gate knows of one source address."""

    __slots__ = ("failures", "last_failure", "not_before", "waiting", "active", "running", "timer")

    def __init__(self) -> None:
        self.failures = 0
        self.last_failure = 0.0
        self.not_before = 0.0
        self.waiting: collections.deque[Ticket] = collections.deque()  # delayed by the throttle
        self.active = 0  # queued or running checks
        self.running = 0
        self.timer: Any = None


class LoginGate:
    """PLAIN checks of one listener (see the module docstring).  `verify(user, password) -> bool`
    runs on the gate's threads (an awaitable result is awaited there); a `verify` with `on_loop` set
    is called on the loop as `verify(user, password, done)` (the pass-through check).  `loop`: the
    event loop (`clock`, `call_later`, `call_soon_threadsafe`).  `on_failure(reason)` counts failed,
    refused and abandoned logins (WRONG, QUEUE_FULL, THROTTLED, ABANDONED, and the SASL failures
    the listener reports through `refused`)."""

    def __init__(self, verify: Any, loop: Any, policy: LoginPolicy | None = None, *,
                 remembered: Callable[[str, str], bool] | None = None,
                 on_failure: Callable[[str], None] | None = None):
        self.verify = verify
        self.loop = loop
        self.policy = policy = policy or LoginPolicy()
        self.remembered = remembered
        self.on_failure = on_failure
        self.on_loop = bool(getattr(verify, "on_loop", False))
        self.concurrency = policy.queue if self.on_loop else policy.workers
        # checks of one address running at once: one thread at least stays free for the others
        self.per_address_running = max(1, self.concurrency - 1)
        self._addresses: dict[str, _Address] = {}
        self._queues: collections.OrderedDict[str, collections.deque[Ticket]] = collections.OrderedDict()
        self.queued = 0
        self.running = 0
        self.counts: collections.Counter[str] = collections.Counter()  # outcomes, for tests and the log
        self._executor: ThreadPoolExecutor | None = None
        self.failures_log = RateLimitedLog(log, policy.log_rate, loop.clock, loop.call_later, "login failures")
        self.logins_log = RateLimitedLog(log, policy.log_rate * 10, loop.clock, loop.call_later, "logins")
        self._sweep_at = 0.0
        self._pump_at: float | None = None  # when a timer pumps again (queued checks of delayed addresses)

    # --------------------------------------------------------------------------------------------
    # the listener's side

    def submit(self, host: str, user: str, password: str, done: Callable[[str], None], *, peer: str = "",
               mechanism: str = "PLAIN") -> Ticket:
        """Check `user`/`password` of a client at `host`; `done(result)` on the loop, possibly at once."""
        ticket = Ticket(self, host, user, password, done, peer or host, mechanism)
        if self.remembered is not None and self.remembered(user, password):
            self._finish(ticket, OK)
            return ticket
        address = self._address(host)
        if len(address.waiting) + address.active >= self.policy.per_address:
            self._refuse(ticket, THROTTLED, f"more than {self.policy.per_address} logins of the address wait")
            return ticket
        now = self.loop.clock()
        if address.failures and (address.not_before > now or address.active or address.waiting):
            ticket.state = "delayed"
            address.waiting.append(ticket)
            self._schedule(host, address)
        else:
            self._enqueue(ticket, address)
        return ticket

    def refused(self, category: str, fields: dict) -> None:
        """A login the SASL exchange refused (wrong credentials, unknown certificate, ...): counted, logged."""
        self._count(category or WRONG)
        self.failures_log(logging.INFO, "client authentication refused", fields)

    def logged_in(self, fields: dict) -> None:
        self.logins_log(logging.INFO, "client logged in", fields)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    # --------------------------------------------------------------------------------------------
    # addresses

    def _address(self, host: str) -> _Address:
        now = self.loop.clock()
        if now >= self._sweep_at:  # forget quiet addresses (bounded memory under a spread-out flood)
            self._sweep_at = now + self.policy.forget
            for key, old in list(self._addresses.items()):
                if not old.active and not old.waiting and now - old.last_failure >= self.policy.forget:
                    del self._addresses[key]
        address = self._addresses.get(host)
        if address is None:
            address = self._addresses[host] = _Address()
        elif address.failures and now - address.last_failure >= self.policy.forget:
            address.failures = 0
            address.not_before = 0.0
        return address

    def delay_of(self, host: str) -> float:
        """Seconds from now before `host`'s next check may start (0: none)."""
        address = self._addresses.get(host)
        return max(0.0, address.not_before - self.loop.clock()) if address is not None else 0.0

    def _failed(self, address: _Address) -> None:
        now = self.loop.clock()
        address.failures += 1
        address.last_failure = now
        address.not_before = now + self.policy.delay_after(address.failures)

    def _schedule(self, host: str, address: _Address) -> None:
        """Release the address's next delayed check when its delay has passed and none of it runs."""
        if address.timer is not None or not address.waiting or address.active:
            return
        wait = max(0.0, address.not_before - self.loop.clock())
        address.timer = self.loop.call_later(wait, lambda: self._release(host, address))

    def _release(self, host: str, address: _Address) -> None:
        address.timer = None
        if not address.waiting or address.active:
            return
        if address.not_before > self.loop.clock():
            self._schedule(host, address)
            return
        self._enqueue(address.waiting.popleft(), address)
        self._schedule(host, address)

    # --------------------------------------------------------------------------------------------
    # the queue and the pool

    def _enqueue(self, ticket: Ticket, address: _Address) -> None:
        if self.queued >= self.policy.queue:
            self._refuse(ticket, QUEUE_FULL, f"{self.policy.queue} login checks wait already")
            return
        ticket.state = "queued"
        queue = self._queues.get(ticket.host)
        if queue is None:
            queue = self._queues[ticket.host] = collections.deque()
        queue.append(ticket)
        self.queued += 1
        address.active += 1
        self._pump()

    def _pump(self) -> None:
        now = self.loop.clock()
        while self.running < self.concurrency and self._queues:
            later = None
            for host, queue in self._queues.items():  # round-robin over the addresses
                address = self._addresses[host]
                if address.not_before > now:  # failed meanwhile: its queued checks wait out the delay too
                    later = address.not_before if later is None else min(later, address.not_before)
                elif address.running < self.per_address_running:
                    break
            else:
                # every waiting address runs as many checks as it may, or waits out its delay
                if later is not None and (self._pump_at is None or later < self._pump_at):
                    self._pump_at = later
                    self.loop.call_later(later - now, self._pump_later)
                return
            ticket = queue.popleft()
            if queue:
                self._queues.move_to_end(host)
            else:
                del self._queues[host]
            self.queued -= 1
            self.running += 1
            address.running += 1
            ticket.state = "running"
            self._run(ticket)

    def _pump_later(self) -> None:
        self._pump_at = None
        self._pump()

    def _run(self, ticket: Ticket) -> None:
        verify, loop = self.verify, self.loop
        if verify is None:
            loop.call_soon_threadsafe(self._checked, ticket, False)
            return
        if self.on_loop:
            verify(ticket.user, ticket.password, lambda ok: loop.call_soon_threadsafe(self._checked, ticket, bool(ok)))
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.policy.workers,
                                                thread_name_prefix="broker-filter-login")

        def check() -> bool:
            result = verify(ticket.user, ticket.password)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
            return bool(result)

        def finished(future: Any) -> None:
            try:
                ok = future.result()
            except Exception:  # noqa: BLE001 - a failing check refuses the client, the loop goes on
                log.exception("checking a client's credentials failed")
                ok = False
            loop.call_soon_threadsafe(self._checked, ticket, ok)

        self._executor.submit(check).add_done_callback(finished)

    def _checked(self, ticket: Ticket, ok: bool) -> None:
        self.running -= 1
        address = self._addresses.get(ticket.host)
        if address is None:  # (forgotten meanwhile: cannot happen while active, but stay safe)
            address = self._address(ticket.host)
        else:
            address.active -= 1
            address.running -= 1
        if not ok:
            self._failed(address)
        cancelled = ticket.state == "cancelled"
        ticket.password = ""
        if cancelled:
            ticket.state = "finished"
        elif ok:
            self._finish(ticket, OK)
        else:
            self._finish(ticket, WRONG)  # the listener counts and logs it (`refused`)
        self._schedule(ticket.host, address)
        self._pump()

    def _cancel(self, ticket: Ticket, abandoned: bool = True) -> None:
        state = ticket.state
        if state in ("finished", "cancelled", "new"):
            return
        address = self._addresses.get(ticket.host)
        if state == "delayed" and address is not None:
            address.waiting.remove(ticket)
        elif state == "queued":
            queue = self._queues.get(ticket.host)
            if queue is not None:
                queue.remove(ticket)
                if not queue:
                    del self._queues[ticket.host]
            self.queued -= 1
            if address is not None:
                address.active -= 1
        if state == "running":
            ticket.state = "cancelled"  # it finishes; its result feeds the throttle
        else:
            ticket.state = "finished"
            ticket.password = ""
            if address is not None:
                if abandoned:
                    self._failed(address)
                self._schedule(ticket.host, address)
            self._pump()
        if not abandoned:
            return
        self._count(ABANDONED)
        self.failures_log(logging.INFO, "client hung up during its login check",
                          {"peer": ticket.peer, "mechanism": ticket.mechanism, "user": _shown(ticket.user),
                           "reason": "abandoned"})

    def _refuse(self, ticket: Ticket, result: str, why: str) -> None:
        self._count(result)
        self.failures_log(logging.WARNING, f"client login refused for now: {why}",
                          {"peer": ticket.peer, "mechanism": ticket.mechanism, "user": _shown(ticket.user),
                           "reason": result})
        self._finish(ticket, result)

    def _finish(self, ticket: Ticket, result: str) -> None:
        ticket.state = "finished"
        ticket.password = ""
        self.counts[result] += 1
        ticket.done(result)

    def _count(self, reason: str) -> None:
        self.counts["failure:" + reason] += 1
        if self.on_failure is not None:
            try:
                self.on_failure(reason)
            except Exception:  # noqa: BLE001 - counting must not break a login
                log.exception("counting a login failure failed")


def _shown(user: str) -> str:
    """A client's user name as logged: at most 100 characters."""
    return user if len(user) <= 100 else user[:100] + "..."


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
