"""Many subscribers in one client process: CONNS connections x 2 filtered receivers on one address,
then MESSAGES published; prints one JSON object with what every receiver got.

Usage: python fanout_client.py URL ADDRESS CONNS MESSAGES TIMEOUT
Receiver "a" of connection c selects `g100 = c % 100`, receiver "b" selects `g50 = c % 50`; message i
carries g100 = i % 100 and g50 = i % 50 (so with 500 connections there are 100 and 50 distinct
selectors, each shared by several receivers on different connections)."""

from __future__ import annotations

import json
import sys
import time

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container, Selector

BATCH = 10
url, address, conns, messages, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])


def expected(c: int, which: str) -> list[int]:
    if which == "a":
        return [i for i in range(messages) if i % 100 == c % 100]
    return [i for i in range(messages) if i % 50 == c % 50]


class Fanout(MessagingHandler):
    def __init__(self):
        super().__init__(prefetch=0, auto_accept=True)
        self.got: dict[str, list[int]] = {}
        self.opened = 0
        self.want = sum(len(expected(c, w)) for c in range(conns) for w in "ab")
        self.received = 0
        self.sent = 0
        self.sender = None
        self.connections = []
        self.started = time.monotonic()
        self.done = False

    def on_start(self, event):
        self.container = event.container
        self.open_batch()
        event.container.schedule(timeout, self)

    def open_batch(self):
        # BATCH connections at a time, the next once their links are attached: a listen backlog
        # overflow would only measure the kernel's SYN retries.
        start = len(self.got) // 2
        for c in range(start, min(start + BATCH, conns)):
            conn = self.container.connect(url)
            self.connections.append(conn)
            for which, selector in (("a", f"g100 = {c % 100}"), ("b", f"g50 = {c % 50}")):
                name = f"{c}{which}"
                self.got[name] = []
                r = self.container.create_receiver(conn, address, name=name, options=Selector(selector))
                r.flow(len(expected(c, which)) + 5)  # room for a wrong extra copy to show up

    def on_link_opened(self, event):
        if event.receiver is not None:
            self.opened += 1
            if self.opened == len(self.got) < 2 * conns:
                self.open_batch()
            if self.opened == 2 * conns:
                conn = event.container.connect(url)
                self.connections.append(conn)
                self.sender = event.container.create_sender(conn, address, name="fanout-sender")

    def on_sendable(self, event):
        sender = event.sender
        while sender.name == "fanout-sender" and sender.credit and self.sent < messages:
            i = self.sent
            sender.send(Message(body=i, properties={"g100": i % 100, "g50": i % 50}))
            self.sent += 1

    def on_message(self, event):
        self.got[event.receiver.name].append(event.message.body)
        self.received += 1
        if self.received == self.want:
            # Any wrong extra copy would arrive right behind: wait a moment before closing.
            event.container.schedule(1.0, self)

    def on_timer_task(self, event):
        self.finish()

    def finish(self):
        if self.done:
            return
        self.done = True
        for conn in self.connections:
            conn.close()
        print(json.dumps({"got": self.got, "sent": self.sent, "opened": self.opened, "seconds": time.monotonic() - self.started}), flush=True)
        self.container.stop()


Container(Fanout()).run()
