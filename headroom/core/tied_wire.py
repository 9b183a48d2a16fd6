"""The wire contract of Tail at Scale's tied requests between `headroom route` and its replicas.

Each copy of a tied request carries `x-headroom-tied: <token>.<copy>` (copy 0 or 1) and
`x-headroom-tied-port: <the router's port>`. When a copy starts executing, its replica sends
`POST /router/tied/<token>.<copy>` (no body) to the router: to the address the request came from, on that
port. The router then cancels the other copy (`headroom.router.attempts`), and the replica holding it drops
it from its queue before it runs (`headroom.server.tied`).
"""

from __future__ import annotations

import re

TIED_HEADER = "x-headroom-tied"
TIED_PORT_HEADER = "x-headroom-tied-port"
CALLBACK_PREFIX = "/router/tied/"
#: token (url-safe base64) "." copy number; anything else is ignored on both sides
TAG_RE = re.compile(r"[A-Za-z0-9_-]{8,64}\.[01]")


def tag(token: str, copy: int) -> str:
    return f"{token}.{copy}"


def parse_tag(text: str) -> tuple[str, int] | None:
    """(token, copy) of a well-formed tag, else None."""
    if not TAG_RE.fullmatch(text):
        return None
    token, _, copy = text.rpartition(".")
    return token, int(copy)


def parse_port(text: str) -> int | None:
    """A TCP port (1-65535) written in decimal, else None."""
    if not (text.isascii() and text.isdigit()) or len(text) > 5:
        return None
    port = int(text)
    return port if 1 <= port <= 65535 else None
