"""The per-message cost of the daemon's admission check (broker_filter/proxy/admission.py) on the publish
path, beside what that path already does to every message (`set_message_annotation`).

Usage: python bench/admission_bench.py [--rounds N]
Prints µs per message for typical message shapes, in front of RabbitMQ 3.x (the check runs) and 4.x
(one attribute test)."""

from __future__ import annotations

import argparse
import sys
import time
import timeit
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker_filter.amqp import types as t  # noqa: E402
from broker_filter.amqp.encoding import encode  # noqa: E402
from broker_filter.amqp.sections import MESSAGE_ANNOTATIONS, encode_section, set_message_annotation  # noqa: E402
from broker_filter.filters import ORIGIN_ANNOTATION  # noqa: E402
from broker_filter.proxy.admission import refused  # noqa: E402
from broker_filter.proxy.traits import traits_of  # noqa: E402


def sec(code: int, value) -> bytes:
    return b"\x00\x53" + bytes((code,)) + encode(value)


class _Upstream:
    def __init__(self, version: str):
        self.traits = traits_of("RabbitMQ", version)
        self.product, self.version, self.name = "RabbitMQ", version, "amqp://127.0.0.1:5672"


SHAPES = {
    "data 100 B, properties (string id, to)": sec(0x73, ["id-1", None, "/queue/orders"]) + sec(0x75, b"x" * 100),
    "data 1 KiB, properties, application-properties (3 strings)":
        sec(0x73, ["id-1", None, "/queue/orders"]) + sec(0x74, {"region": "eu", "kind": "order", "colour": "red"})
        + sec(0x75, bytes(range(256)) * 4),
    "data 1 KiB, header, properties (uuid id, creation-time), application-properties (ints, strings)":
        sec(0x70, [True, t.ubyte(4)]) + sec(0x73, [uuid.uuid4(), None, "/queue/orders", None, None, None,
                                                   t.symbol("application/json"), None, t.timestamp(1_700_000_000_000)])
        + sec(0x74, {"n": t.int32(7), "price": 12.5, "kind": "order", "qty": t.long(1000)})
        + sec(0x75, bytes(range(256)) * 4),
    "a proton client's (header, properties with creation-time, app-properties int/long/double/string)":
        sec(0x70, []) + sec(0x73, ["ID:bench-1", None, "/queue/x", None, None, None, None, None, None,
                                   t.timestamp(1_700_000_000_000)])
        + sec(0x74, {"n": t.long(1), "big": t.long(2**40), "price": 12.5, "kind": "order"}) + sec(0x77, b"x" * 100),
    "amqp-value string body, properties": sec(0x73, ["id-1", None, "/queue/orders"]) + sec(0x77, "hello " * 20),
    "amqp-value map body (10 entries)": sec(0x73, ["id-1"]) + sec(0x77, {f"k{i}": t.int32(i) for i in range(10)}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--number", type=int, default=20000)
    args = ap.parse_args()
    origin = encode_section(MESSAGE_ANNOTATIONS, {ORIGIN_ANNOTATION: "c1"})
    r3, r4 = _Upstream("3.10.8"), _Upstream("4.0.5")
    print(f"{'message':<96} {'annotate':>9} {'check 3.x':>10} {'check 4.x':>10}  (CPU µs per message, best of "
          f"{args.rounds})")
    for name, raw in SHAPES.items():
        data = set_message_annotation(raw, ORIGIN_ANNOTATION, "c1", origin)  # as the publish path has it
        assert refused(r3, data) is None, name

        def best(fn) -> float:
            runs = timeit.repeat(fn, number=args.number, repeat=args.rounds, timer=time.process_time)
            return min(runs) / args.number * 1e6

        annotate = best(lambda: set_message_annotation(raw, ORIGIN_ANNOTATION, "c1", origin))
        c3 = best(lambda: refused(r3, data))
        c4 = best(lambda: refused(r4, data))
        print(f"{name:<96} {annotate:>9.2f} {c3:>10.2f} {c4:>10.2f}")


if __name__ == "__main__":
    main()
