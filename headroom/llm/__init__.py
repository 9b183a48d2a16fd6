"""headroom's LLM engine: continuous batching over a paged KV cache, prefix caching, OpenAI serving.

See docs/llm.md. The offline API::

    from headroom.llm import LLM, SamplingParams
    LLM().generate(["Hello"], SamplingParams(temperature=0, max_tokens=16))
"""

from __future__ import annotations

from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.offline import LLM, GenerationResult, load_engine
from headroom.llm.request import SamplingParams

__all__ = ["LLM", "DecoderConfig", "EngineConfig", "GenerationResult", "SamplingParams", "load_engine"]
