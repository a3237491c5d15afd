"""The PLAIN users of the authorization and limits tests (alice, bob) and a login as one of them."""

from __future__ import annotations

from broker_filter.security import hash_password

PASSWORDS = {"alice": "wonderland", "bob": "builder"}
HASHES = {user: hash_password(password, algorithm="pbkdf2-sha256") for user, password in PASSWORDS.items()}
# `[listener.users]` with both (a TOML table, ending with a blank line)
USERS = "[listener.users]\n" + "".join(f'{user} = "{h}"\n' for user, h in HASHES.items()) + "\n"


def login(daemon, user: str):
    """A proton connection to `daemon` as `user` (PLAIN)."""
    from clients import connect

    return connect(daemon.url, user=user, password=PASSWORDS[user], allowed_mechs="PLAIN")
