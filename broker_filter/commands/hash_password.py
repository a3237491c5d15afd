"""`broker-filter hash-password`: print a password hash for `[listener.users]`."""

from __future__ import annotations

import argparse
import getpass
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hash-password",
        help="hash a password for the PLAIN users of the configuration",
        description="Read a password (prompted twice on a terminal, else the first line of standard "
        "input) and print its salted hash for `[listener.users]` in the configuration file.",
    )
    p.add_argument(
        "--algorithm", choices=("scrypt", "pbkdf2-sha256"), default="scrypt", help="hash function (default scrypt)"
    )
    p.add_argument(
        "--cost", type=int, default=None, metavar="N",
        help="work factor: scrypt's log2 of N (default 15, 10..22: each step doubles the time and memory) or "
        "PBKDF2's iterations (default 600000, 10000..10000000); the daemon reads it from the stored hash",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..security import check_cost, hash_password

    if args.cost is not None:
        try:
            check_cost(args.algorithm, args.cost)
        except ValueError as e:
            print(f"broker-filter: --cost: {e}", file=sys.stderr)
            return 2
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("broker-filter: the passwords differ", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("broker-filter: empty password refused", file=sys.stderr)
        return 2
    print(hash_password(password, algorithm=args.algorithm, cost=args.cost))
    return 0
