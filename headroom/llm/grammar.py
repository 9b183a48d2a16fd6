"""Constrained decoding with llguidance: grammars compiled once per schema, a matcher per sequence, token masks.

Mechanism only (what a grammar *is* for a request is `headroom.llm.structured_output`):

- `GrammarCompiler` turns an llguidance grammar (the JSON text `LLMatcher.grammar_from_json_schema` makes) into
  a ready matcher. Compiled matchers are kept in an LRU (`cache_size` grammars) and every sequence gets a
  `deep_copy` of the cached one, so a schema is compiled once however many requests use it. The llguidance
  tokenizer is built from the model's own `tokenizer.json` (the one built from the GGUF) on first use (~0.3 s).
  `compile` is thread-safe: the HTTP layer calls it in a worker thread (never on the event loop) to refuse a
  bad schema with a 400 before the request reaches the engine; the engine thread then hits the cache.
- `MaskWorker` computes the next-token bitmasks of a step's constrained sequences in its own thread while the
  runner's forward runs (the native kernels and torch release the GIL), so the masks are off the critical path;
  on machines of 2 cores or fewer it computes them right after the forward instead (see `MaskWorker`).
- `apply_bitmask` sets the disallowed entries of the constrained sequences' logits rows to -inf; no other row
  is touched, so unconstrained sequences in the same batch keep their exact (batch-invariant) logits.

A grammar error (a token the matcher refuses, a matcher in an error state) is raised as `GrammarError`, which
the engine turns into the failure of that one request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from headroom.core.errors import HeadroomError, InvalidRequest
from headroom.llm.request import Request
from headroom.llm.threads import usable_cpus
from headroom.protocol.openai_errors import FieldError

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLTokenizer

DEFAULT_CACHE_SIZE = 128  # compiled grammars kept (LRU)
# row b: the additive penalty of each of the 8 tokens whose allowed-bits are byte b (little-endian bit order)
_BYTE_PENALTIES = np.array([[0.0 if b >> j & 1 else -np.inf for j in range(8)] for b in range(256)], dtype=np.float32)


class GrammarError(HeadroomError):
    """This sequence's grammar matcher failed (500, this request only)."""


class GrammarCompiler:
    """Compiled llguidance matchers by grammar text (LRU), for one tokenizer and logits width."""

    def __init__(self, tokenizer_json: Path, eos_token_id: int | None, vocab_size: int,
                 cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size}")
        self.tokenizer_json = tokenizer_json
        self.eos_token_id = eos_token_id
        self.vocab_size = vocab_size  # width of the logits rows (and of every mask)
        self.cache_size = cache_size
        self._lock = threading.Lock()
        self._tokenizer: LLTokenizer | None = None
        self._cache: OrderedDict[str, LLMatcher] = OrderedDict()
        self.compiled = 0  # grammars compiled (cache misses), for tests and metrics

    def _lltokenizer(self) -> LLTokenizer:
        import llguidance

        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.LLTokenizer(
                    self.tokenizer_json.read_text(), n_vocab=self.vocab_size, eos_token=self.eos_token_id
                )
            return self._tokenizer

    def compile(self, grammar: str, param: str = "response_format.json_schema.schema") -> LLMatcher:
        """The cached compiled matcher for `grammar` (compiling it on a miss); FieldError naming `param` when
        the grammar does not compile. Callers must not advance the returned matcher: use `matcher()`."""
        import llguidance

        with self._lock:
            hit = self._cache.get(grammar)
            if hit is not None:
                self._cache.move_to_end(grammar)
                return hit
        try:
            matcher = llguidance.LLMatcher(self._lltokenizer(), grammar)
        except BaseException as exc:  # ValueError for a bad grammar, or a Rust panic: this request's 400
            if not _contained(exc):
                raise
            raise FieldError(param, f"{param}: the schema cannot be used: {exc}") from None
        if matcher.is_error():
            raise FieldError(param, f"{param}: the schema cannot be used: {matcher.get_error()}")
        with self._lock:
            self._cache[grammar] = matcher
            self._cache.move_to_end(grammar)
            self.compiled += 1
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return matcher

    def matcher(self, grammar: str) -> LLMatcher:
        """A fresh matcher for one sequence (a copy of the compiled one)."""
        return self.compile(grammar).deep_copy()


def compiler_for(tokenizer: object, vocab_size: int) -> GrammarCompiler | None:
    """The compiler for a `headroom.llm.tokenizer.Tokenizer` (None for a tokenizer without tokenizer.json files)."""
    files = getattr(tokenizer, "files", None)
    path = getattr(files, "tokenizer_json", None)
    if not isinstance(path, Path):
        return None
    return GrammarCompiler(path, getattr(tokenizer, "eos_token_id", None), vocab_size)


def new_matcher(compiler: GrammarCompiler | None, grammar: str) -> LLMatcher:
    """A sequence's matcher for `grammar`; InvalidRequest without a compiler, FieldError for a bad grammar."""
    if compiler is None:
        raise InvalidRequest("constrained output needs the model's tokenizer.json, which this engine has not got")
    return compiler.matcher(grammar)


def compute_masks(matchers: Sequence[LLMatcher], vocab_size: int) -> tuple[np.ndarray, dict[int, str]]:
    """int32 bitmasks [len(matchers), ceil(vocab/32)] (bit t of a row set = token t allowed next), and the
    matchers (by position) that are in an error state, with their error."""
    words = (vocab_size + 31) // 32
    masks = np.zeros((len(matchers), words), dtype=np.int32)
    errors: dict[int, str] = {}
    for i, m in enumerate(matchers):
        try:
            m.unsafe_compute_mask_ptr(masks[i].ctypes.data, words * 4)
        except BaseException as exc:  # a Rust panic (pyo3's PanicException is a BaseException): this one only
            if not _contained(exc):
                raise
            errors[i] = f"llguidance failed: {exc}"
            continue
        if m.is_error():
            errors[i] = m.get_error().splitlines()[0] if m.get_error() else "the matcher failed"
    return masks, errors


def _contained(exc: BaseException) -> bool:
    """Whether an exception out of llguidance is the grammar's (an Exception or a Rust panic), not the process's
    (KeyboardInterrupt, SystemExit)."""
    return not isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit)


def apply_bitmask(rows: np.ndarray, masks: np.ndarray) -> None:
    """Disallowed tokens of logits rows [k, V] (or one row [V]) become -inf, in place; `masks` [k, W] (or [W])
    int32 bitmasks, bit t of a row = token t allowed. Each mask byte indexes a table of its 8 additive
    penalties (0 or -inf), added to the row: about 3x less CPU than unpacking bits and masked_fill (32 rows
    of SmolLM2's 49152: 3.4 vs 10.6 ms on a loaded 2-core machine)."""
    packed = np.ascontiguousarray(masks, dtype=np.int32).view(np.uint8)  # little-endian: byte j holds bits 8j..
    penalty = _BYTE_PENALTIES[packed]
    rows += penalty.reshape(*penalty.shape[:-2], -1)[..., : rows.shape[-1]]


def advance(matcher: LLMatcher, token: int) -> None:
    """Feed the sampled token to the sequence's matcher; GrammarError when it refuses it."""
    try:
        ok = matcher.consume_token(token)
    except BaseException as exc:  # a Rust panic: this sequence only
        if not _contained(exc):
            raise
        raise GrammarError(f"llguidance failed on token {token}: {exc}") from None
    if not ok:
        detail = matcher.get_error() or "the token does not fit the grammar"
        raise GrammarError(f"the output grammar refused token {token}: {detail.splitlines()[0]}")


class MaskWorker:
    """One thread that computes a step's masks while the forward runs; `close()` ends it (the engine owns it).

    `threaded=False` computes them on the engine thread after the forward instead. That is the default when this
    process may use 2 CPUs or fewer (its affinity mask), where the step's own threads use every one: an extra thread
    there stalls the step more than it hides (benchmarks/llm/bench_structured_output.py measures both)."""

    def __init__(self, threaded: bool | None = None) -> None:
        self.threaded = usable_cpus() > 2 if threaded is None else threaded
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, matchers: Sequence[LLMatcher], vocab_size: int) -> Future[tuple[np.ndarray, dict[int, str]]]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-grammar-mask")
        return self._pool.submit(compute_masks, list(matchers), vocab_size)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


MATCHER_KEY = "grammar_matcher"  # where a constrained sequence keeps its matcher (`Request.extra`)


class StepMasks:
    """The masks of one step's constrained sequences: started before the forward, applied after it."""

    def __init__(self, worker: MaskWorker, sampling: Sequence[Request], vocab_size: int) -> None:
        """Start computing the masks of the constrained ones among the sequences that sample this step."""
        seqs = [r for r in sampling if MATCHER_KEY in r.extra]
        self.ids = [r.request_id for r in seqs]
        self._matchers = [r.extra[MATCHER_KEY] for r in seqs]
        self._vocab_size = vocab_size
        self._future = worker.submit(self._matchers, vocab_size) if seqs and worker.threaded else None

    def apply(self, rows: np.ndarray, row_ids: Sequence[str]) -> dict[str, GrammarError]:
        """Mask the rows (row i is sequence `row_ids[i]`) of the constrained sequences in place; the sequences
        whose matcher failed, with the error (their rows are left as they are)."""
        if not self.ids:
            return {}
        if self._future is not None:
            masks, errors = self._future.result()
        else:
            masks, errors = compute_masks(self._matchers, self._vocab_size)
        where = {seq_id: i for i, seq_id in enumerate(row_ids)}
        pairs = [(where[seq_id], k) for k, seq_id in enumerate(self.ids) if seq_id in where and k not in errors]
        if pairs:
            idx = [r for r, _ in pairs]
            if idx == list(range(rows.shape[0])):  # every row is constrained: in place, no gather
                apply_bitmask(rows, masks[[k for _, k in pairs]])
            else:
                sub = rows[idx]
                apply_bitmask(sub, masks[[k for _, k in pairs]])
                rows[idx] = sub
        return {self.ids[k]: GrammarError(f"the output grammar failed: {msg}") for k, msg in errors.items()}
