"""Closing and refusing a client link as the wire contract says (WIRE-CONTRACT.md): a refused attach
is answered with a null source (receiver) or target (sender), then detached with the error."""

from __future__ import annotations

from typing import Any

from ..engine.endpoints import LOCAL_CLOSED, LOCAL_UNINIT, Condition, Link, Terminus

_NULL = Terminus(null=True)


def close_link(link: Link, condition: str, description: str | None, info: dict | None = None) -> None:
    """Detach `link` (closed) with the error; opened first if it was never answered."""
    state = link.local_state
    if state == LOCAL_CLOSED:
        return
    if state == LOCAL_UNINIT:
        link.open()
    link.close((condition, description or "", info) if info else Condition(condition, description or ""))


def refuse_link(link: Link, condition: str, description: str | None, info: Any = None) -> None:
    """Answer `link`'s attach with a null terminus on the client's side, then detach it with the
    error.  A link already answered is only detached."""
    state = link.local_state
    if state == LOCAL_CLOSED:
        return
    if state == LOCAL_UNINIT:
        if link.is_sender:
            link.set_source(_NULL)
            link.copy_remote_target()
        else:
            link.set_target(_NULL)
            link.copy_remote_source()
        link.open()
    close_link(link, condition, description, info)
