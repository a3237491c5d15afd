"""A python-qpid-proton client in a process of its own, for the engine's socket tests.

    python amqp_client.py URL send ADDRESS COUNT | receive ADDRESS COUNT | idle SECONDS
        [--user U --password P] [--mechs "PLAIN"] [--ca ca.pem] [--cert c.pem --key c.key]
        [--heartbeat SECONDS] [--release] [--wait SECONDS] [--selector TEXT] [--size BYTES]
    (binary bodies are reported as their SHA-256)

Prints one JSON line: {"ok": true, ...} or {"ok": false, "error": "<condition or exception text>"}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("mode", choices=("send", "receive", "idle"))
    parser.add_argument("args", nargs="*")
    parser.add_argument("--user")
    parser.add_argument("--password")
    parser.add_argument("--mechs")
    parser.add_argument("--ca")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--heartbeat", type=float)
    parser.add_argument("--release", action="store_true")
    parser.add_argument("--wait", type=float, default=15.0, help="seconds to wait for each message")
    parser.add_argument("--selector", help="receive: a JMS selector on the source")
    parser.add_argument("--size", type=int, help="send: binary bodies of this many bytes")
    options = parser.parse_args()

    from proton import Message, SSLDomain
    from proton.reactor import Selector
    from proton.utils import BlockingConnection

    kwargs: dict = {"timeout": max(15.0, options.wait)}
    if options.user is not None:
        kwargs.update(user=options.user, password=options.password)
    if options.mechs:
        kwargs["allowed_mechs"] = options.mechs
    if options.heartbeat:
        kwargs["heartbeat"] = options.heartbeat
    if options.ca:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(options.ca)
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER, options.ca)
        if options.cert:
            domain.set_credentials(options.cert, options.key, None)
        kwargs["ssl_domain"] = domain
    result: dict = {"ok": True}
    try:
        connection = BlockingConnection(options.url, **kwargs)
        if options.mode == "send":
            address, count = options.args[0], int(options.args[1])
            sender = connection.create_sender(address)
            for i in range(count):
                body = bytes(range(256)) * (options.size // 256) if options.size else f"m{i}"
                sender.send(Message(body=body, properties={"i": i, "half": i % 2}))
            result["sent"] = count
        elif options.mode == "receive":
            address, count = options.args[0], int(options.args[1])
            selector = Selector(options.selector) if options.selector else None
            receiver = connection.create_receiver(address, credit=min(count, 100), options=selector)
            print(json.dumps({"attached": True}), flush=True)  # (`wait_attached`; the result is the last line)
            bodies = []
            for _ in range(count):
                message = receiver.receive(timeout=options.wait)
                body = message.body  # a binary body is a memoryview into `message`: keep both alive
                bodies.append(body if isinstance(body, str) else hashlib.sha256(bytes(body)).hexdigest())
                if options.release:
                    receiver.release()
                else:
                    receiver.accept()
            result["bodies"] = bodies
            receiver.close()  # detach before closing: a topic subscription must not outlive us
        else:
            try:  # run the connection (heartbeats both ways) without traffic
                connection.wait(lambda: False, timeout=float(options.args[0]))
            except Exception as e:  # noqa: BLE001 - the expected Timeout of the wait
                if type(e).__name__ != "Timeout":
                    raise
            connection.create_sender("ping").send(Message(body="after-idle"))
        connection.close()
    except Exception as e:  # noqa: BLE001 - reported to the test
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
