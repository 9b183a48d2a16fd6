"""A request's "execution started" signal, carried from the HTTP edge to whatever executes the request.

Tail at Scale's tied requests need to know when a copy of a request *begins executing* (leaves the queue), so
that its twin on another replica can be cancelled before it runs. The edge (`headroom.server.tied`) binds a
hook for the request's task; the component that finally executes the request takes it, once, and calls it
at that moment: the batcher when the request's batch starts (`Batcher.submit(on_start=...)`), the LLM engine
on the request's first output. Taking clears it, so a request that passes through two executors (an
ensemble's steps) signals once.

A ContextVar, because the hook belongs to one request task and must not be threaded through every layer in
between (the same way `headroom.gateway.context` carries the request id to log lines).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar, Token

StartHook = Callable[[], None]

log = logging.getLogger(__name__)
_hook: ContextVar[StartHook | None] = ContextVar("headroom_start_hook", default=None)


def bind(hook: StartHook) -> Token[StartHook | None]:
    """Bind `hook` for the current task (undo with `reset`)."""
    return _hook.set(hook)


def reset(token: Token[StartHook | None]) -> None:
    _hook.reset(token)


def take() -> StartHook | None:
    """The current request's hook, once: later calls in the same task get None."""
    hook = _hook.get()
    if hook is not None:
        _hook.set(None)
    return hook


def fire(hook: StartHook | None) -> None:
    """Call `hook` (if any); a failing hook is logged, never raised into the executor that calls it."""
    if hook is None:
        return
    try:
        hook()
    except Exception:
        log.exception("a request's start hook failed")
