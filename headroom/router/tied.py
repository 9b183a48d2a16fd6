"""Router side of Tail at Scale's tied requests: the open races and which copy of each started first.

Tail at Scale (Dean & Barroso 2013, "tied requests"): send a request to two servers, each copy tagged with
its twin, and cancel the twin as soon as one copy *begins executing*, so that a queued copy never runs twice
while the request still gets the shorter of two queues. Here the replicas tell the router
(`headroom.core.tied_wire`, `headroom.server.tied`) and the router cancels the twin, which removes it from
its replica's queue; `headroom.router.attempts` runs the race. Tokens are random and single-use: a notice for
a race that is over (or never was) changes nothing.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, replace

from headroom.core.tied_wire import TIED_HEADER, TIED_PORT_HEADER, parse_tag, tag
from headroom.router.wire import Outgoing

#: headers a client may not send through the router (the router sets its own)
CLIENT_FORBIDDEN = frozenset({TIED_HEADER, TIED_PORT_HEADER})


@dataclass(frozen=True, slots=True)
class TiedRace:
    """One request's tied race: its token and the future the first start notice resolves (the copy)."""

    token: str
    started: asyncio.Future[int]

    def outgoing(self, out: Outgoing, copy: int) -> Outgoing:
        """`out` tagged as copy `copy` (0 or 1), with the port the notice comes back to."""
        return replace(out, headers=(*out.headers, (TIED_HEADER, tag(self.token, copy)),
                                     (TIED_PORT_HEADER, str(out.callback_port))))


class TiedRaces:
    """The open races, by token (owned by the router's event loop)."""

    def __init__(self) -> None:
        self._open: dict[str, TiedRace] = {}
        self.notices = 0  # start notices that decided a race
        self.stale = 0  # notices for a race already decided, over or unknown

    def open(self) -> TiedRace:
        race = TiedRace(secrets.token_urlsafe(12), asyncio.get_running_loop().create_future())
        self._open[race.token] = race
        return race

    def close(self, race: TiedRace) -> None:
        self._open.pop(race.token, None)
        if not race.started.done():
            race.started.cancel()

    def started(self, text: str) -> bool:
        """A replica's start notice for tag `text`; True when it decided its race (the first of the two)."""
        parsed = parse_tag(text)
        race = self._open.get(parsed[0]) if parsed is not None else None
        if parsed is None or race is None or race.started.done():
            self.stale += 1
            return False
        race.started.set_result(parsed[1])
        self.notices += 1
        return True

    def __len__(self) -> int:
        return len(self._open)
