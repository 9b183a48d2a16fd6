"""OpenAI-compatible chat completions and completions over an `AsyncLLMEngine`, free of any transport.

A transport calls `create_chat_completion(body)` / `create_completion(body)` with the parsed JSON body and
gets a `ServingResponse`: a JSON body with a status, or an async iterator of server-sent-event chunks
(`data: {json}\\n\\n` ... `data: [DONE]\\n\\n`). Errors use OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`: 400 for bad input (including prompt + max_tokens over
the context), 404 for an unknown model, 429 with Retry-After when the waiting queue is full, 503 while
the engine is not running.

Every generation that got past admission reports one `LLMUsage` (tokens and the engine's queue / prefill /
decode times) to the caller's `on_usage` when it ends, however it ends (finished, aborted because the client
left, past its deadline, failed). The gateway refunds unused LLM tokens from it and records spans. Non-streamed
responses also carry the times as `Server-Timing: preprocess, queue, prefill, decode, total` (milliseconds).

Prefix-cache isolation: a request reuses cached prompt blocks only from requests of the same `tenant` (the
gateway's authenticated tenant, passed by the transport) with the same `cache_salt` (vLLM's field).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from pydantic import ValidationError

from headroom.core.errors import (
    ContextLengthExceeded,
    DeadlineExceeded,
    HeadroomError,
    InvalidRequest,
    ModelNotFound,
    NotReady,
)
from headroom.core.lifecycle import ServingLifecycle
from headroom.llm.admission import admitted
from headroom.llm.async_engine import AsyncLLMEngine
from headroom.llm.block_hash import prefix_cache_key
from headroom.llm.chat_messages import ToolTurns, probe_tool_turns, template_messages
from headroom.llm.openai_protocol import (
    BaseRequest,
    ChatRequest,
    CompletionRequest,
    ServingResponse,
    from_exception,
    sse,
)
from headroom.llm.openai_usage import RequestObserver, Tally, UsageCallback, observed, usage_body
from headroom.llm.request import SamplingParams, SequenceOutput, TokenLogprob
from headroom.llm.structured_output import OutputPlan, output_plan
from headroom.llm.tokenizer import Tokenizer, chat_prompt_ids
from headroom.llm.tools import ToolPlan, final_tool_delta, with_tool_calls
from headroom.llm.validation import FieldError, Kind, check_body, logit_bias, token_ids

log = logging.getLogger("headroom.llm")
_R = TypeVar("_R", bound=BaseRequest)


class OpenAIServing:
    """Chat completions, completions and the model card for one served LLM."""

    def __init__(self, model_name: str, tokenizer: Tokenizer | None = None, max_model_len: int = 0,
                 lifecycle: ServingLifecycle | None = None) -> None:
        self.model_name = model_name
        self.lifecycle = lifecycle or ServingLifecycle()  # the server's: admission, drain, in-flight count
        self.engine: AsyncLLMEngine | None = None  # attached once the model is loaded
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.created = int(time.time())
        self.request_timeout_s = 0.0  # 0 = no deadline
        self.weight_format = ""  # what the model runs on, e.g. "gguf:Q4_1+Q8_0" or "fp32" ("" = not loaded yet)
        self.observer: RequestObserver | None = None  # sees every request's outcome (statistics)
        self.unloaded = False  # unloaded through the repository API (or its directory removed): 404
        self.tool_turns = ToolTurns(False, False)  # what the chat template renders of tool-call turns

    def attach(
        self, engine: AsyncLLMEngine, tokenizer: Tokenizer, max_model_len: int, request_timeout_s: float = 0.0
    ) -> None:
        """Serve through a started engine; requests running past `request_timeout_s` (> 0) are aborted (504)."""
        self.engine, self.tokenizer, self.max_model_len = engine, tokenizer, max_model_len
        self.tool_turns = probe_tool_turns(tokenizer.apply_chat_template)
        self.request_timeout_s = request_timeout_s

    def model_cards(self) -> list[dict[str, Any]]:
        """Entries for `GET /v1/models` (none while unloaded)."""
        if self.unloaded:
            return []
        card: dict[str, Any] = {"id": self.model_name, "object": "model", "created": self.created}
        card.update({"owned_by": "headroom", "max_model_len": self.max_model_len})
        if self.weight_format:
            card["weight_format"] = self.weight_format
        return [card]

    # --- entry points -----------------------------------------------------------------------------------
    @admitted
    async def create_chat_completion(
        self, body: Any, on_usage: UsageCallback | None = None, tenant: str = ""
    ) -> ServingResponse:
        """`on_usage` gets one `LLMUsage` when a generation that was admitted ends (never for refusals);
        `tenant` scopes the prefix cache."""
        started_s = time.monotonic()
        tally: Tally | None = None
        try:
            req = self._parse(body, "chat", ChatRequest)
            tok = self._ready()
            plan = await self._plan(req)
            messages = template_messages(req.messages, self.tool_turns, self.model_name)
            tools = plan.tools.tools if plan.tools is not None else None
            prompt_ids = chat_prompt_ids(tok, messages, tools)
            max_tokens = req.max_completion_tokens or req.max_tokens
            top = req.top_logprobs if req.logprobs else None
            params = self._params(req, prompt_ids, max_tokens, (top or 0) if req.logprobs else None, plan.grammar)
            tally = Tally(started_s, len(prompt_ids), observed(self.observer, on_usage))
            return await self._run("chat", req, prompt_ids, params, tally, tenant, plan.tools)
        except (ValidationError, HeadroomError) as exc:
            return self._refused(started_s, tally, exc)
        except Exception as exc:  # e.g. the tokenizer or chat template failed on this input: 500, this one only
            log.exception("request to %s failed", self.model_name)
            return self._refused(started_s, tally, exc)

    @admitted
    async def create_completion(
        self, body: Any, on_usage: UsageCallback | None = None, tenant: str = ""
    ) -> ServingResponse:
        """As `create_chat_completion`, for a plain prompt."""
        started_s = time.monotonic()
        tally: Tally | None = None
        try:
            req = self._parse(body, "completion", CompletionRequest)
            tok = self._ready()
            prompt = req.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                if len(prompt) != 1:
                    raise FieldError("prompt", "send one prompt per request (a list of one string is accepted)")
                prompt = prompt[0]
            if isinstance(prompt, str):
                prompt_ids = tok.encode(prompt)
            else:
                prompt_ids = list(token_ids(prompt, "prompt", self._vocab_size()))
            params = self._params(req, prompt_ids, req.max_tokens, req.logprobs, (await self._plan(req)).grammar)
            tally = Tally(started_s, len(prompt_ids), observed(self.observer, on_usage))
            return await self._run("text", req, prompt_ids, params, tally, tenant)
        except (ValidationError, HeadroomError) as exc:
            return self._refused(started_s, tally, exc)
        except Exception as exc:  # e.g. the tokenizer or chat template failed on this input: 500, this one only
            log.exception("request to %s failed", self.model_name)
            return self._refused(started_s, tally, exc)

    # --- internals --------------------------------------------------------------------------------------
    def _refused(self, started_s: float, tally: Tally | None, exc: Exception) -> ServingResponse:
        """The error response; the observer counts the failure unless the generation already reported it."""
        if self.observer is not None and (tally is None or tally.usage is None):
            self.observer.on_refused(time.monotonic() - started_s)
        return from_exception(exc)

    def _parse(self, body: Any, kind: Kind, model: type[_R]) -> _R:
        """`body` checked field by field (headroom.llm.validation), then typed."""
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object")
        return model.model_validate(check_body(body, kind, frozenset(model.model_fields), self._vocab_size()))

    def _vocab_size(self) -> int | None:
        """Token ids a request may name: the tokenizer's and the model's logits' vocabulary alike."""
        sizes = [self.tokenizer.vocab_size] if self.tokenizer is not None else []
        if self.engine is not None:
            sizes.append(self.engine.engine.runner.vocab_size)
        return min(sizes) if sizes else None

    def _ready(self) -> Tokenizer:
        if self.unloaded:
            raise ModelNotFound(f"model {self.model_name!r} is unloaded; load it through the repository API "
                                f"(POST /v2/repository/models/{self.model_name}/load)")
        if self.engine is None or self.tokenizer is None or not self.engine.healthy:
            raise NotReady(f"model {self.model_name!r} is loading or stopped; retry shortly")
        return self.tokenizer

    async def _plan(self, req: BaseRequest) -> OutputPlan:
        """The request's output grammar and tools (structured_output), compiled off the event loop."""
        grammars = self.engine.engine.grammars if self.engine is not None else None
        template = self.tokenizer.files.chat_template if self.tokenizer is not None else None
        return await asyncio.to_thread(output_plan, req, template, self.model_name, grammars)

    def _params(
        self, req: BaseRequest, prompt_ids: list[int], max_tokens: int | None, logprobs: int | None,
        grammar: str | None = None,
    ) -> SamplingParams:
        if req.model and req.model != self.model_name:
            raise ModelNotFound(f"the model {req.model!r} does not exist; this server serves {self.model_name!r}")
        if not prompt_ids:
            raise FieldError("prompt" if isinstance(req, CompletionRequest) else "messages", "the prompt is empty")
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        limit = self.max_model_len
        if self.engine is not None:  # an unspecified max_tokens also has to fit the KV pool
            kv = self.engine.engine.kv
            limit = min(limit, kv.num_blocks * kv.block_size)
        room = limit - len(prompt_ids)
        if max_tokens is None and room < 1:
            raise ContextLengthExceeded(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{len(prompt_ids)}; shorten it"
            )
        params = SamplingParams(
            n=req.n,
            max_tokens=max_tokens if max_tokens is not None else room,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            seed=req.seed,
            stop=stop,
            stop_token_ids=token_ids(req.stop_token_ids or [], "stop_token_ids", self._vocab_size()),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            include_stop_str_in_output=req.include_stop_str_in_output,
            logit_bias=logit_bias(req.logit_bias, self._vocab_size()) if req.logit_bias else (),
            grammar=grammar,
        )
        params.validate()
        return params

    async def _run(
        self, kind: str, req: BaseRequest, prompt_ids: list[int], params: SamplingParams, tally: Tally,
        tenant: str = "", tools: ToolPlan | None = None,
    ) -> ServingResponse:
        engine = self.engine
        if engine is None:
            raise NotReady("not ready")
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        rid = f"{prefix}-{uuid.uuid4().hex}"
        tally.n, tally.submitted_s = params.n, time.monotonic()
        cache_key = prefix_cache_key(tenant, req.cache_salt)
        outputs = _with_deadline(
            await engine.generate(rid, prompt_ids, params, priority=req.priority, cache_key=cache_key),
            self.request_timeout_s,
        )
        created = int(time.time())
        if req.stream:
            usage = bool((req.stream_options or {}).get("include_usage"))
            stream = self._stream(kind, rid, created, outputs, len(prompt_ids), usage, tally, tools)
            return ServingResponse(200, stream=stream)
        final = tally.last
        try:
            async for out in outputs:
                final[out.index] = out
        except BaseException as exc:
            tally.report(failed=not isinstance(exc, DeadlineExceeded | asyncio.CancelledError))
            raise
        usage_report = tally.report()
        choices = [
            self._choice(kind, o, o.text, o.logprobs, 0, final=True)
            for o in sorted(final.values(), key=lambda o: o.index)
        ]
        if tools is not None:
            choices = [with_tool_calls(c, tools) for c in choices]
        body = {
            "id": rid,
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created,
            "model": self.model_name,
            "choices": choices,
            "usage": usage_body(len(prompt_ids), list(final.values())),
        }
        return ServingResponse(200, body=body, headers={"Server-Timing": usage_report.server_timing()})

    def _choice(
        self, kind: str, out: SequenceOutput, text: str, lps: tuple[TokenLogprob, ...], offset: int, final: bool
    ) -> dict[str, Any]:
        finish = out.finish_reason.value if out.finish_reason else None
        choice: dict[str, Any] = {"index": out.index}
        if kind == "chat":
            key = "message" if final else "delta"
            choice[key] = {"role": "assistant", "content": text} if final else {"content": text}
            choice["logprobs"] = self._chat_logprobs(lps) if out.logprobs or lps else None
        else:
            choice["text"] = text
            choice["logprobs"] = self._text_logprobs(lps, offset) if lps else None
        choice["finish_reason"] = finish
        return choice

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False) if self.tokenizer else str(token_id)

    def _chat_logprobs(self, lps: tuple[TokenLogprob, ...]) -> dict[str, Any]:
        def entry(tid: int, lp: float) -> dict[str, Any]:
            text = self._token_text(tid)
            return {"token": text, "logprob": lp, "bytes": list(text.encode())}

        content = [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in lps]
        return {"content": content}

    def _text_logprobs(self, lps: tuple[TokenLogprob, ...], offset: int) -> dict[str, Any]:
        tokens = [self._token_text(lp.token_id) for lp in lps]
        offsets, pos = [], offset
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{self._token_text(t): v for t, v in lp.top} for lp in lps],
            "text_offset": offsets,
        }

    async def _stream(
        self,
        kind: str,
        rid: str,
        created: int,
        outputs: AsyncIterator[SequenceOutput],
        num_prompt: int,
        include_usage: bool,
        tally: Tally,
        tools: ToolPlan | None = None,
    ) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        head = {"id": rid, "object": obj, "created": created, "model": self.model_name}
        last = tally.last
        sent_lps: dict[int, int] = {}
        sent_text: dict[int, int] = {}
        failed = False
        try:
            async for out in outputs:
                if kind == "chat" and out.index not in last:
                    role = {"index": out.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                    yield sse({**head, "choices": [{**role, "finish_reason": None}]})
                last[out.index] = out
                if tools is not None and tools.parse_calls:  # held back: the whole text may be a call array
                    if out.finished:
                        yield sse({**head, "choices": [final_tool_delta(out, tools)]})
                    continue
                lps = out.logprobs[sent_lps.get(out.index, 0) :]
                if not out.delta_text and not out.finished and not lps:
                    continue
                sent_lps[out.index] = len(out.logprobs)
                choice = self._choice(kind, out, out.delta_text, lps, sent_text.get(out.index, 0), final=False)
                sent_text[out.index] = sent_text.get(out.index, 0) + len(out.delta_text)
                yield sse({**head, "choices": [choice]})
            if include_usage:
                yield sse({**head, "choices": [], "usage": usage_body(num_prompt, list(last.values()))})
        except HeadroomError as exc:
            failed = not isinstance(exc, DeadlineExceeded)
            yield sse(from_exception(exc).body or {})
        except Exception as exc:  # e.g. decoding a logprob's token failed: end this stream with an error event
            log.exception("stream %s failed", rid)
            failed = True
            yield sse(from_exception(exc).body or {})
        finally:  # also when the client left (the response closes this generator) or the task was cancelled
            report = tally.report(failed)
        # the stream's Server-Timing, as an SSE comment (ignored by SSE clients, the OpenAI SDK included)
        yield f": server-timing {report.server_timing()}\n\n"
        yield "data: [DONE]\n\n"


async def _with_deadline(outputs: AsyncIterator[SequenceOutput], timeout_s: float) -> AsyncIterator[SequenceOutput]:
    """Pass outputs through; past the deadline, close the engine stream (which aborts the request) and raise."""
    it = aiter(outputs)
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    try:
        while True:
            try:
                if timeout_s > 0:
                    out = await asyncio.wait_for(anext(it), max(0.0, end - loop.time()))
                else:
                    out = await anext(it)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise DeadlineExceeded(
                    f"the request ran past request_timeout_s={timeout_s}; ask for fewer max_tokens"
                ) from None
            yield out
    finally:
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            await aclose()
