"""`NativeRunner`: the default CPU runner, every step ONE call of the native C step on the GGUF's own blocks.

The weights stay in the file's formats (`headroom.llm.native_weights`); `headroom.llm.kernels.native` runs the
whole step (embedding, every layer, the lm_head rows that are asked for) for any mix of prefill chunks and
decodes, with per-row block-quantised activations and reductions in a fixed order, so a sequence's logits do
not depend on what else is in the step, how its prompt was chunked or how many threads ran it. The K/V pool
is numpy arrays (fp32, head-major, one zeroed mapping, `headroom.llm.kv_pool`), as the torch runner's layout, so
swapping and preemption work the same. Nothing here imports torch.

If the kernel library cannot be built here the runner refuses to start, saying how to fix it: the slow
reference arithmetic (`quant_blocks`) is a test oracle, never a silent fallback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.kernels.build import KernelUnavailableError
from headroom.llm.kv_pool import allocate_kv_arrays, swap_in_blocks, swap_out_blocks
from headroom.llm.native_weights import NativeCheckpoint
from headroom.llm.step_batch import ModelBatch
from headroom.llm.step_threads import StepThreads

if TYPE_CHECKING:
    from headroom.llm.kernels.native import NativeDecoderWeights


class NativeRunner:
    """Runs a `NativeCheckpoint` through the native step kernel over a preallocated fp32 K/V pool."""

    def __init__(self, ckpt: NativeCheckpoint, engine: EngineConfig, num_blocks: int | None = None) -> None:
        """`num_blocks`: the pool's size in blocks when the caller knows it (a draft model sized to the target's
        pool); by default as many as `engine.kv_cache_memory_mb` holds."""
        from headroom.llm.kernels.build import load_library
        from headroom.llm.kernels.native import NativeStepKernel

        cfg: DecoderConfig = ckpt.config
        self.config = cfg
        self.weight_format = ckpt.weight_format
        self.threads = StepThreads(engine, on_cpu=True)
        self.block_size = engine.block_size_tokens
        self.num_blocks, self.kv_bytes_per_block, self.kv_caches = allocate_kv_arrays(cfg, engine, num_blocks)
        self.vocab_size = cfg.vocab_size
        try:
            lib = load_library()
        except KernelUnavailableError as exc:
            raise ValueError(
                f"weight_dtype native needs the native C kernels, which cannot be built here ({exc}); install a C "
                "compiler (gcc/cc with OpenMP: apt-get install gcc) or set weight_dtype: fp32 in the model's "
                "parameters (the slower fp32 reference)"
            ) from exc
        self.kernel = NativeStepKernel(lib, native_decoder_weights(ckpt), self.kv_caches, self.block_size)
        self.isa = self.kernel.isa  # the instruction-set path the kernel runs (scalar | avx2 | avx512vnni)

    @property
    def threads_now(self) -> int:
        """The thread count the last step ran with (0 = never set by this runner)."""
        return self.threads.now

    def execute(self, batch: ModelBatch) -> np.ndarray:
        return self.threads.run(batch, lambda threads: self.kernel.step(batch, threads, batch.cancel_flag_address))

    def swap_out(self, block_ids: Sequence[int]) -> object:
        return swap_out_blocks(self.kv_caches, self.block_size, block_ids)

    def swap_in(self, host_copy: object, block_ids: Sequence[int]) -> None:
        swap_in_blocks(self.kv_caches, self.block_size, host_copy, block_ids)


def native_decoder_weights(ckpt: NativeCheckpoint) -> NativeDecoderWeights:
    """The checkpoint's HF-named tensors as the kernel's `NativeDecoderWeights`."""
    from headroom.llm.kernels.native import NativeDecoderWeights, NativeLayerWeights

    m, v = ckpt.matrices, ckpt.vectors
    missing = [n for n in ("model.embed_tokens.weight", "model.norm.weight") if n not in m and n not in v]
    if missing:
        raise ValueError(f"{ckpt.source}: the GGUF lacks {missing}")
    layers = []
    for i in range(ckpt.config.num_hidden_layers):
        p = f"model.layers.{i}."
        try:
            layers.append(
                NativeLayerWeights(
                    input_norm=v[p + "input_layernorm.weight"],
                    post_norm=v[p + "post_attention_layernorm.weight"],
                    q=m[p + "self_attn.q_proj.weight"],
                    k=m[p + "self_attn.k_proj.weight"],
                    v=m[p + "self_attn.v_proj.weight"],
                    o=m[p + "self_attn.o_proj.weight"],
                    gate=m[p + "mlp.gate_proj.weight"],
                    up=m[p + "mlp.up_proj.weight"],
                    down=m[p + "mlp.down_proj.weight"],
                    q_bias=v.get(p + "self_attn.q_proj.bias"),
                    k_bias=v.get(p + "self_attn.k_proj.bias"),
                    v_bias=v.get(p + "self_attn.v_proj.bias"),
                )
            )
        except KeyError as exc:
            raise ValueError(f"{ckpt.source}: the GGUF lacks {exc.args[0]} (layer {i})") from None
    return NativeDecoderWeights(
        config=ckpt.config,
        embed=m["model.embed_tokens.weight"],
        layers=tuple(layers),
        final_norm=v["model.norm.weight"],
        lm_head=m["lm_head.weight"],
    )
