"""`serve --model-control-mode poll`: watch the repository and apply changes, as Triton's POLL mode.

Every `interval_s` the poller fingerprints each model directory (config.yaml and every file under the
numeric version directories: path, size, mtime) and compares with the last poll (`poll_plan`, pure):
a new or changed directory is (re)loaded through the model manager, so a failed reload keeps the old
versions serving; a removed directory is unloaded. A generative (`backend: llm`) model reloads the same way
(its new engine loads while the old one serves; the old one then drains: server/generative.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from headroom.core.errors import HeadroomError
from headroom.server.model_manager import ModelManager

log = logging.getLogger("headroom.models")


@dataclass(frozen=True, slots=True)
class PollPlan:
    """What one poll does: names to (re)load and names to unload, each sorted."""

    load: tuple[str, ...]
    unload: tuple[str, ...]


def poll_plan(before: Mapping[str, str], after: Mapping[str, str]) -> PollPlan:
    """Compare two {model name: fingerprint} snapshots."""
    changed = sorted(name for name, fp in after.items() if before.get(name) != fp)
    removed = sorted(name for name in before if name not in after)
    return PollPlan(tuple(changed), tuple(removed))


def fingerprint(directory: Path) -> str:
    """A text that changes whenever config.yaml or a file under a numeric version directory changes."""
    parts: list[str] = []
    files: Iterable[Path] = [directory / "config.yaml"]
    for version in sorted(p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()):
        files = [*files, *sorted(f for f in version.rglob("*") if f.is_file())]
    for path in files:
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        parts.append(f"{path.relative_to(directory)}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def snapshot(root: Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """{model name: fingerprint} of every model directory (a config.yaml) under `root` (or only `names`)."""
    wanted = set(names) if names is not None else None
    out: dict[str, str] = {}
    if not root.is_dir():
        return out
    for directory in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        if (directory / "config.yaml").exists() and (wanted is None or directory.name in wanted):
            out[directory.name] = fingerprint(directory)
    return out


class RepositoryPoller:
    """Runs `poll_plan` every `interval_s` against the repository; `run()` is owned by the server."""

    def __init__(self, root: Path, manager: ModelManager, interval_s: float,
                 names: Iterable[str] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"--repository-poll-secs must be > 0, got {interval_s}")
        self._root = root
        self._manager = manager
        self._interval_s = interval_s
        self._names = tuple(names) if names is not None else None
        self._last: dict[str, str] = {}

    async def prime(self) -> None:
        """Take the snapshot the first poll compares against (call once the initial models are loaded)."""
        self._last = await asyncio.to_thread(snapshot, self._root, self._names)

    async def poll_once(self) -> PollPlan:
        current = await asyncio.to_thread(snapshot, self._root, self._names)
        plan = poll_plan(self._last, current)
        steps: tuple[tuple[tuple[str, ...], Callable[[str], Awaitable[object]], str, int, str], ...] = (
            (plan.load, self._manager.reload, "poll: loaded %s", logging.ERROR,
             "poll: loading %s failed; the previous versions keep serving: %s"),
            (plan.unload, self._manager.remove, "poll: unloaded %s (its directory is gone)", logging.WARNING,
             "poll: unloading %s: %s"),
        )
        for names, apply, done, failure_level, failed in steps:
            for name in names:
                try:
                    await apply(name)
                    log.info(done, name)
                except HeadroomError as exc:
                    log.log(failure_level, failed, name, exc.message)
        self._last = current
        return plan

    async def run(self) -> None:
        """Poll until cancelled; a poll that fails (a directory vanishing mid-scan) is logged and retried."""
        await self.prime()
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.poll_once()
            except OSError as exc:
                log.warning("poll: scanning %s failed, retrying next poll: %s", self._root, exc)


__all__ = ["PollPlan", "RepositoryPoller", "fingerprint", "poll_plan", "snapshot"]
