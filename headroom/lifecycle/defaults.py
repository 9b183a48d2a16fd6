"""The packaged default models for `headroom models pull NAME` (no network): their config.yaml, and how their
artifacts are produced (digits: trained from scikit-learn's bundled data; minilm: exported from the installed
weights package; noop: nothing, its class ships with headroom). The configs (default_configs/<name>.yaml, package
data) are copies of the repository's models/*/config.yaml (noop's: benchmarks/models/noop, the overhead probe,
which the default repository does not serve); a test keeps them equal.
"""

from __future__ import annotations

from pathlib import Path

_CONFIG_DIR = Path(__file__).parent / "default_configs"
#: name -> its config.yaml, as shipped in default_configs/<name>.yaml
DEFAULT_CONFIGS = {name: (_CONFIG_DIR / f"{name}.yaml").read_text() for name in ("digits", "minilm", "noop")}


def build_default(name: str, version_dir: Path) -> str:
    """Produce a default model's artifacts in `version_dir`; returns a one-line summary. Raises ValueError."""
    version_dir.mkdir(parents=True, exist_ok=True)
    if name == "noop":
        return "nothing to build: its class ships with headroom (headroom.models.builtin.noop)"
    if name == "digits":
        from headroom.lifecycle.digits_reference import write_drift_reference
        from headroom.models.builtin.digits_build import build_digits

        report = build_digits(version_dir)
        write_drift_reference(version_dir)
        return f"trained: held-out accuracy {report.accuracy:.2%}; wrote the drift reference"
    if name == "minilm":
        from headroom.models.artifacts import resolve_artifact
        from headroom.models.builtin.minilm import DEFAULT_WEIGHTS
        from headroom.models.builtin.minilm_build import build_minilm_onnx

        weights = resolve_artifact(DEFAULT_WEIGHTS, version_dir, "minilm")
        minilm = build_minilm_onnx(version_dir, weights)
        return f"exported the encoder (within {minilm.max_abs_error:.1e} of torch)"
    raise ValueError(f"no packaged default model named {name!r}; packaged: {', '.join(DEFAULT_CONFIGS)}")
