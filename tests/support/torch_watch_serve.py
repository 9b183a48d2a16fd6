"""`headroom serve` that says at exit whether torch was ever imported (test-only, never shipped).

    python -m tests.support.torch_watch_serve serve ...   (the arguments of `headroom serve`)

On a normal exit (SIGTERM drains and returns) it prints `TORCH_IMPORTED=True|False` to stderr.
"""

from __future__ import annotations

import atexit
import sys

from headroom.cli.main import main

MARKER = "TORCH_IMPORTED="


def _report() -> None:
    print(f"{MARKER}{'torch' in sys.modules}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    atexit.register(_report)
    main()
