"""Configuration of the LLM engine: the decoder architecture and the engine's scheduling/cache settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from headroom.models.config import refuse_unknown_keys

WEIGHT_DTYPES = ("auto", "native", "fp32")  # values of EngineConfig.weight_dtype
#: Engine keys that existed once: a config that still sets one is refused with what replaced it (A/B switches
#: whose losing side was removed once the benchmarks settled them).
REMOVED_KEYS = {
    "attention_backend": "removed in session 9: the C paged-attention kernel is used whenever it builds and "
    "serves the model (CPU fp32), torch ops otherwise (one log line says why)",
    "wide_step_min_tokens": "removed in session 9: the thread tuner measures every step size from the start "
    "(headroom.llm.threads); set num_threads to fix the count",
    "decode_backend": "removed in session 7: native weights always use the native decode step",
    "kernel_decode_max_seqs": "removed in session 7: the native decode step serves every batch size",
}
#: The other keys an LLM model's `parameters:` may carry (read by headroom.llm.factory and the data plane); any key
#: that is neither one of these nor an EngineConfig field is a mistake and refused with a did-you-mean.
SERVICE_KEYS = ("model", "gguf", "served_model_name", "cache_dir", "warmup_tokens", "chat_template", "labels")


@dataclass(frozen=True, slots=True)
class DecoderConfig:
    """A Llama-family decoder (Llama, SmolLM2, Qwen2): RMSNorm, RoPE, grouped-query attention, SwiGLU."""

    vocab_size: int  # rows of the embedding / logits columns
    hidden_size: int  # model width
    intermediate_size: int  # SwiGLU inner width
    num_hidden_layers: int  # decoder blocks
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # key/value heads (< query heads = grouped-query attention)
    max_position_embeddings: int  # context length in tokens
    rms_norm_eps: float = 1e-5  # RMSNorm epsilon
    rope_theta: float = 10000.0  # RoPE base frequency
    tie_word_embeddings: bool = False  # logits reuse the embedding matrix
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    head_dim: int = 0  # per-head width; 0 = hidden_size // num_attention_heads

    @property
    def head_dim_resolved(self) -> int:
        """The per-head width actually used."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        """Raise ValueError for an impossible architecture."""
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if min(self.vocab_size, self.hidden_size, self.num_hidden_layers, self.intermediate_size) < 1:
            raise ValueError("vocab_size, hidden_size, intermediate_size, num_hidden_layers must be >= 1")

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form (stored next to converted weights)."""
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DecoderConfig:
        """Read our own JSON form or a Hugging Face `config.json` (extra keys ignored)."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known and v is not None}
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if isinstance(rope, Mapping):
            if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
                raise ValueError(f"RoPE scaling {rope!r} is not supported (only plain RoPE)")
            if "rope_theta" not in kwargs and rope.get("rope_theta") is not None:
                kwargs["rope_theta"] = rope["rope_theta"]
        if "num_key_value_heads" not in kwargs and "num_attention_heads" in kwargs:
            kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
        if "attention_bias" not in kwargs and raw.get("model_type") == "qwen2":
            kwargs["attention_bias"] = True
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Settings of the engine; every key can be given under `parameters:` of a model's config.yaml."""

    block_size_tokens: int = 16  # tokens per KV-cache block
    kv_cache_memory_mb: float = 256.0  # memory budget the block pool is preallocated from
    max_num_seqs: int = 32  # most sequences in one step
    max_num_batched_tokens: int = 512  # per-step token budget (prefill chunks + decodes)
    max_waiting_requests: int = 256  # bounded waiting queue; beyond it admission fails (HTTP 429)
    enable_prefix_caching: bool = True  # reuse full blocks across requests by chained content hash
    enable_chunked_prefill: bool = True  # split long prompts across steps, mixed with decodes
    max_model_len: int = 0  # context limit in tokens; 0 = the model's max_position_embeddings
    device: str = "cpu"  # "cpu" | "cuda" | "auto" (cuda when available)
    dtype: str = "auto"  # "auto" (fp32 on cpu, bf16 on cuda) | "float32" | "bfloat16" | "float16"
    # intra-op threads per step on CPU; 0 = auto: chosen per step by measuring, among 1, 2, 4, ... up to the CPUs
    # this process may use (its affinity mask; headroom.llm.threads)
    num_threads: int = 0
    # "auto" (native for a GGUF on CPU, else weights in `dtype`) | "native" (the GGUF's own block formats, Q4_0 /
    # Q4_1 / Q8_0 / F16 / F32, run by the native C step, headroom.llm.kernels.native; CPU only; batch-invariant) |
    # "fp32" (the reference: weights dequantised to `dtype`, the torch model; equals transformers' greedy output)
    weight_dtype: str = "auto"
    swap_space_mb: float = 0.0  # host memory for swap preemption; 0 = preempt by recompute only
    speculative_ngram_tokens: int = 0  # prompt-lookup speculative decoding: draft length; 0 = off
    speculative_draft_model: str = ""  # draft-model speculation: a .gguf, HF directory or package: ("" = off)
    speculative_draft_tokens: int = 4  # draft length (tokens per step) with a draft model
    retry_after_s: float = 1.0  # Retry-After hint when the waiting queue is full
    request_timeout_s: float = 0.0  # OpenAI requests running longer are aborted with 504; 0 = no deadline
    seed: int = 0  # seed for requests that name none (sampling stays reproducible per engine)

    def validate(self) -> None:
        """Raise ValueError naming the bad key and what would fix it."""
        if self.block_size_tokens < 1:
            raise ValueError("block_size_tokens must be >= 1 (16 is usual)")
        if self.kv_cache_memory_mb <= 0:
            raise ValueError("kv_cache_memory_mb must be > 0")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.max_waiting_requests < 1:
            raise ValueError("max_waiting_requests must be >= 1")
        if self.device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device {self.device!r}: use cpu, cuda or auto")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype {self.dtype!r}: use auto, float32, bfloat16 or float16")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(
                f"weight_dtype {self.weight_dtype!r}: use auto (native for a GGUF on CPU), native (the GGUF's own "
                "quantised formats, CPU only) or fp32 (the reference, dequantised weights)"
            )
        if self.num_threads < 0:
            raise ValueError("num_threads must be >= 0 (0 = chosen per step by measuring)")
        if self.swap_space_mb < 0:
            raise ValueError("swap_space_mb must be >= 0 (0 = recompute only)")
        if self.speculative_ngram_tokens < 0:
            raise ValueError("speculative_ngram_tokens must be >= 0")
        if self.speculative_draft_tokens < 1:
            raise ValueError("speculative_draft_tokens must be >= 1 (4 is usual); unset speculative_draft_model")
        if self.speculative_draft_model and self.speculative_ngram_tokens:
            raise ValueError(
                "speculative_draft_model and speculative_ngram_tokens are mutually exclusive: "
                "set speculative_ngram_tokens: 0 to use the draft model, or drop speculative_draft_model"
            )

    @classmethod
    def from_parameters(cls, params: Mapping[str, Any]) -> EngineConfig:
        """Pick the engine keys out of a config.yaml `parameters:` mapping. The service's own keys
        (`SERVICE_KEYS`) are left to it; a key the engine no longer has is refused with what replaced it
        (`REMOVED_KEYS`), and any other unknown key (a typo: `max_num_seq`) with the closest known one."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in params.items():
            if key in REMOVED_KEYS:
                raise ValueError(f"parameters.{key}: {REMOVED_KEYS[key]}; delete the key")
            if key in SERVICE_KEYS:
                continue
            if key not in known:
                refuse_unknown_keys({key: value}, [*known, *SERVICE_KEYS], "parameters")
            default = getattr(cls(), key)
            kwargs[key] = type(default)(value) if not isinstance(default, bool) else _as_bool(key, value)
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ValueError(f"parameters.{key}: expected true or false, got {value!r}")
