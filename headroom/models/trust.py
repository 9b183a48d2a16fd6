"""Which model code a server runs: the `--trusted-backends` allowlist (see docs/SECURITY.md, "Trust model").

Whoever can write the model repository chooses code that the server runs. `backend: python` imports a
`model.py` from the repository, and `parameters: {allow_pickle: true}` lets a model read pickle files, which
run code when read. A server started with `trusted` refuses, when it scans the repository, every model
that needs a kind outside it, with a message saying how to allow it:

* `onnxruntime`, `torch` (safetensors weights or TorchScript; the module classes are importable code that
  is already installed), `llm` (GGUF / safetensors weights): data read by headroom's own loaders;
* `python`: a `backend: python` model whose class comes from the repository (a `model_class` inside the
  `headroom` package is headroom's own code and needs only the backend to be trusted);
* `pickle`: a model whose config sets `allow_pickle: true`.
"""

from __future__ import annotations

from collections.abc import Iterable

from headroom.models.artifacts import ModelLoadError, pickle_allowed
from headroom.models.config import ModelConfig

#: Every kind the allowlist can name.
TRUST_KINDS = ("onnxruntime", "torch", "llm", "python", "pickle")
#: What `headroom serve` trusts by default: no repository code, no pickle.
DEFAULT_TRUSTED = frozenset({"onnxruntime", "torch", "llm"})
_SHIPPED_PREFIX = "headroom."
_WHY = {
    "python": "imports and runs a model.py from the model repository",
    "pickle": "sets allow_pickle: true, and reading a pickle file runs the code inside it",
}


def parse_trusted(text: str) -> frozenset[str]:
    """`onnxruntime,torch,llm` -> the set; raises ValueError naming an unknown kind."""
    kinds = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(kinds - set(TRUST_KINDS))
    if unknown:
        raise ValueError(f"--trusted-backends: unknown {', '.join(unknown)}; choose from {', '.join(TRUST_KINDS)}")
    return kinds


def required_kinds(config: ModelConfig) -> tuple[str, ...]:
    """The kinds a model needs trusted to be served."""
    kinds: list[str] = []
    if config.backend != "python":
        kinds.append(config.backend)
    elif not str(config.parameters.get("model_class", "")).startswith(_SHIPPED_PREFIX):
        kinds.append("python")
    if pickle_allowed(config.parameters):
        kinds.append("pickle")
    return tuple(kinds)


def check_trusted(config: ModelConfig, trusted: Iterable[str], where: str) -> None:
    """Raise ModelLoadError when the model needs a kind outside `trusted`, saying how to allow it."""
    allowed = frozenset(trusted)
    for kind in required_kinds(config):
        if kind in allowed:
            continue
        why = _WHY.get(kind, f"uses the {kind} backend")
        wanted = ",".join(k for k in TRUST_KINDS if k in allowed or k == kind)
        raise ModelLoadError(
            f"{where}: model {config.name!r} {why}, and this server trusts only "
            f"{', '.join(k for k in TRUST_KINDS if k in allowed) or 'nothing'} (--trusted-backends). If you trust "
            f"everyone who can write this model repository, start the server with --trusted-backends {wanted}"
        )
