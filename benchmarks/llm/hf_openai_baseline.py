"""A plain HF transformers server with an OpenAI `/v1/chat/completions` route: the baseline for the LLM engine.

Two modes, both greedy, both on the same (dequantised fp32) SmolLM2 weights `headroom serve` loads:

  one      one request at a time: `generate` with batch size 1; everyone else waits in a FIFO.
  static   static batching: the first waiting request opens a batch, up to --max-batch requests that arrive
           within --batch-wait-ms join it, the prompts are left-padded and `generate`d together for the
           longest max_tokens; nobody joins a running batch (what continuous batching fixes).

Tokens are streamed as server-sent events as `generate` produces them (a streamer per batch), with the final
`usage` chunk when `stream_options.include_usage` is set, so `headroom bench --protocol openai-chat` measures
TTFT/TPOT exactly as for any other server. `ignore_eos: true` keeps a request going to its max_tokens.

    .venv/bin/python benchmarks/llm/hf_openai_baseline.py --port 8200 --mode static --max-batch 32
    headroom bench http://127.0.0.1:8200 -m smollm2 -p openai-chat --concurrency 8 --ignore-eos ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from headroom.llm.offline import DEFAULT_MODEL
from headroom.llm.tokenizer import Tokenizer
from headroom.llm.weights import load_checkpoint

_DONE = object()  # end-of-stream marker put on a request's token queue


@dataclass(slots=True)
class Job:
    """One chat request on its way through the worker thread."""

    prompt_ids: list[int]  # chat-templated prompt tokens
    max_tokens: int  # most tokens to generate
    ignore_eos: bool  # keep going past EOS
    loop: asyncio.AbstractEventLoop  # the server's event loop (tokens are handed over thread-safely)
    tokens: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)  # generated ids, then _DONE
    generated: int = 0  # tokens delivered so far
    finished: bool = False  # max_tokens reached or EOS seen

    def deliver(self, token_id: int, eos_id: int | None) -> None:
        if self.finished:
            return
        self.generated += 1
        self.loop.call_soon_threadsafe(self.tokens.put_nowait, token_id)
        if self.generated >= self.max_tokens or (token_id == eos_id and not self.ignore_eos):
            self.finish()

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.loop.call_soon_threadsafe(self.tokens.put_nowait, _DONE)


def hf_model(model_spec: str) -> tuple[Any, Tokenizer]:
    """HF LlamaForCausalLM on the weights the engine loads (as benchmarks/llm/bench_engine.py builds it)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    ckpt = load_checkpoint(model_spec)
    c = ckpt.config
    cfg = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,  # type: ignore[call-arg]
        tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    with torch.device("meta"):
        hf = LlamaForCausalLM(cfg)
    hf.load_state_dict(dict(ckpt.state_dict), assign=True, strict=False)
    hf.tie_weights()
    hf.model.rotary_emb = LlamaRotaryEmbedding(config=cfg)
    return hf.eval(), Tokenizer(ckpt.tokenizer)  # type: ignore[no-untyped-call]


class BatchStreamer:
    """`generate`'s streamer: the first put() is the prompt (skipped), then one token per row per step."""

    def __init__(self, jobs: list[Job], eos_id: int | None) -> None:
        self.jobs, self.eos_id, self._prompt_seen = jobs, eos_id, False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        for job, token in zip(self.jobs, value.reshape(len(self.jobs), -1)[:, -1].tolist(), strict=True):
            job.deliver(int(token), self.eos_id)

    def end(self) -> None:
        for job in self.jobs:
            job.finish()


class Worker:
    """The model thread: takes jobs from a FIFO, one at a time or as a static batch, and runs `generate`."""

    def __init__(self, model: Any, eos_id: int | None, mode: str, max_batch: int, batch_wait_ms: float) -> None:
        self.model, self.eos_id, self.mode = model, eos_id, mode
        self.max_batch = 1 if mode == "one" else max_batch
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.batches: list[int] = []  # batch sizes run (for /stats)
        self._thread = threading.Thread(target=self._loop, name="hf-generate", daemon=True)
        self._thread.start()

    def _next_batch(self) -> list[Job]:
        batch = [self.jobs.get()]
        deadline = time.monotonic() + self.batch_wait_s
        while len(batch) < self.max_batch:
            try:
                batch.append(self.jobs.get(timeout=max(deadline - time.monotonic(), 0.0)))
            except queue.Empty:
                break
        return batch

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            self.batches.append(len(batch))
            try:
                self._generate(batch)
            except Exception:  # a failed batch must not kill the worker: its requests end (empty)
                for job in batch:
                    job.finish()

    def _generate(self, batch: list[Job]) -> None:
        width = max(len(j.prompt_ids) for j in batch)
        ids = torch.tensor([[0] * (width - len(j.prompt_ids)) + j.prompt_ids for j in batch])
        mask = torch.tensor([[0] * (width - len(j.prompt_ids)) + [1] * len(j.prompt_ids) for j in batch])
        with torch.inference_mode():
            self.model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max(j.max_tokens for j in batch),
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
                streamer=BatchStreamer(batch, self.eos_id),
            )


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def build_app(worker: Worker, tokenizer: Tokenizer, model_name: str) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        messages = body.get("messages") or []
        prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        job = Job(prompt_ids, max_tokens, bool(body.get("ignore_eos")), asyncio.get_running_loop())
        worker.jobs.put(job)
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name}

        async def tokens() -> AsyncIterator[int]:
            while (item := await job.tokens.get()) is not _DONE:
                yield int(item)

        def usage(n: int) -> dict[str, int]:
            return {"prompt_tokens": len(prompt_ids), "completion_tokens": n, "total_tokens": len(prompt_ids) + n}

        if not body.get("stream"):
            out = [t async for t in tokens()]
            message = {"role": "assistant", "content": tokenizer.decode(out)}
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model_name,
                    "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
                    "usage": usage(len(out)),
                }
            )

        async def stream() -> AsyncIterator[bytes]:
            out: list[int] = []
            sent = ""
            async for token in tokens():
                out.append(token)
                text = tokenizer.decode(out)
                if text.endswith("\ufffd") or not text.startswith(sent):
                    continue  # an incomplete UTF-8 character: its text comes with the next token
                delta, sent = text[len(sent) :], text
                yield _sse(head | {"choices": [{"index": 0, "delta": {"content": delta}, "finish_reason": None}]})
            yield _sse(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                yield _sse(head | {"choices": [], "usage": usage(len(out))})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model"}]})

    async def health(_: Request) -> Response:
        return JSONResponse({"ok": True})

    async def stats(_: Request) -> Response:
        sizes = worker.batches
        return JSONResponse({"batches": len(sizes), "mean_batch": sum(sizes) / len(sizes) if sizes else 0.0})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
            Route("/stats", stats),
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8200)
    ap.add_argument("--mode", choices=("one", "static"), default="one", help="one at a time, or static batches")
    ap.add_argument("--max-batch", type=int, default=32, help="static: most requests per batch")
    ap.add_argument("--batch-wait-ms", type=float, default=50.0, help="static: how long a batch waits to fill")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="GGUF file, HF directory or package:NAME/FILE")
    ap.add_argument("--served-model-name", default="smollm2")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = hf_model(args.model)
    worker = Worker(model, tokenizer.eos_token_id, args.mode, args.max_batch, args.batch_wait_ms)
    warm = Job(tokenizer.encode("Hello"), 2, True, asyncio.new_event_loop())
    worker._generate([warm])  # one short generation before serving (first-call costs)
    uvicorn.run(
        build_app(worker, tokenizer, args.served_model_name), host=args.host, port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
