"""Closing and refusing a client link as the wire contract says (WIRE-CONTRACT.md): a refused attach
is answered with a null source (receiver) or target (sender), then detached with the error."""

from __future__ import annotations

from proton import Condition, Endpoint, Terminus


def close_link(link, condition: str, description: str | None, info: dict | None = None) -> None:
    """Detach `link` (closed) with the error; opened first if it was never answered."""
    if link.state & Endpoint.LOCAL_CLOSED:
        return
    if link.state & Endpoint.LOCAL_UNINIT:
        link.open()
    link.condition = Condition(condition, description, info)
    link.close()


def refuse_link(link, condition: str, description: str | None, info: dict | None = None) -> None:
    """Answer `link`'s attach with a null terminus on the client's side, then detach it with the
    error.  A link already answered is only detached."""
    if link.state & Endpoint.LOCAL_CLOSED:
        return
    if link.state & Endpoint.LOCAL_UNINIT:
        if link.is_sender:
            link.source.type = Terminus.UNSPECIFIED
            link.target.copy(link.remote_target)
        else:
            link.target.type = Terminus.UNSPECIFIED
            link.source.copy(link.remote_source)
        link.open()
    close_link(link, condition, description, info)
