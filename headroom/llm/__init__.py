"""headroom's LLM engine: continuous batching over a paged KV cache, prefix caching, OpenAI serving.

See docs/llm.md. The offline API::

    from headroom.llm import LLM, SamplingParams
    LLM().generate(["Hello"], SamplingParams(temperature=0, max_tokens=16))

The names below load on first use, so importing a light submodule (`headroom.llm.block_hash`, which the router
uses) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headroom.llm.config import DecoderConfig, EngineConfig
    from headroom.llm.offline import LLM, GenerationResult, load_engine
    from headroom.llm.request import SamplingParams

__all__ = ["LLM", "DecoderConfig", "EngineConfig", "GenerationResult", "SamplingParams", "load_engine"]

_HOMES = {"LLM": "offline", "GenerationResult": "offline", "load_engine": "offline", "DecoderConfig": "config",
          "EngineConfig": "config", "SamplingParams": "request"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'headroom.llm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"headroom.llm.{home}"), name)
