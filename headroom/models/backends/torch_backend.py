"""The `torch` backend: safetensors weights into a module class named in the config, or a TorchScript file.

Parameters::

    module: mypackage.nets:MyNet      # importable "module:Class" (an nn.Module); with `weights`
    module_kwargs: {hidden: 128}      # keyword arguments for the class (optional)
    weights: model.safetensors        # state dict; .pt/.pth/.bin/.pkl need `allow_pickle: true`
    torchscript: model.ts             # alternative to module + weights: a torch.jit.save'd file
    num_threads: 2                    # torch intra-op threads (process-wide in PyTorch; optional)

`runtime: {mode: compile}` wraps the module in torch.compile (inductor by default) and compiles it at load,
in a `compile` cold-start stage, for every warmup batch size; the compiled artifacts are cached across
restarts (headroom.models.backends.compiled). `runtime.intra_op_threads` overrides `num_threads`.
A subclass that overrides `load()` must pass its module through `apply_runtime` and then call
`compile_now` (and set `runtime_aware = True`), or a config asking for `mode: compile` is refused.

`predict` calls the module with the batch's tensors positionally in the config's input order, under
`torch.inference_mode()` in eval mode. A tensor result is the first declared output; a tuple maps to the
declared outputs in order; a dict maps by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from safetensors.torch import load_file

from headroom.models.artifacts import (
    ModelLoadError,
    import_object,
    int_parameter,
    pickle_allowed,
    refuse_pickle,
    resolve_artifact,
)
from headroom.models.backends.compiled import (
    artifact_path,
    compile_module,
    file_fingerprint,
    load_artifacts,
    save_artifacts,
)
from headroom.models.base import Arrays, LoadContext, Model


def apply_num_threads(parameters: Mapping[str, object], where: str) -> None:
    """Set torch's intra-op thread count when the config asks for one (PyTorch keeps it per process)."""
    threads = int_parameter(parameters, "num_threads", 0, where)
    if threads > 0:
        torch.set_num_threads(threads)


class TorchModel(Model):
    """Runs a PyTorch module (eager with safetensors weights, or TorchScript) on the CPU."""

    module: torch.nn.Module | None = None
    #: this class applies `runtime.mode` itself (see the module docstring)
    runtime_aware: ClassVar[bool] = True
    #: what the compiled-artifact cache did at the last load: "", "off", "hit", "miss (written)"
    compile_cache: str = ""
    _artifacts: Path | None = None

    def apply_runtime(self, module: torch.nn.Module, ctx: LoadContext, weights: Path | None) -> torch.nn.Module:
        """The module as `runtime:` asks: unchanged (eager) or torch.compile'd, cached artifacts loaded."""
        runtime = self.config.runtime
        where = f"model {self.config.name!r} ({ctx.version_dir})"
        if runtime.intra_op_threads:
            torch.set_num_threads(runtime.intra_op_threads)
        if runtime.precision == "bf16":
            module = module.to(torch.bfloat16)
        if runtime.mode != "compile":
            return module
        compiled = compile_module(module, runtime, where)
        self.compile_cache = "off"
        self._artifacts = None
        if runtime.compile_cache:
            parts = (self.config.name, f"{type(module).__module__}.{type(module).__qualname__}",
                     file_fingerprint(weights) if weights is not None and weights.exists() else "")
            self._artifacts = artifact_path(runtime, self.config.name, parts)
            with ctx.stage("load_compile_cache"):
                self.compile_cache = "hit" if load_artifacts(self._artifacts) else "miss"
        return compiled

    def compile_now(self, ctx: LoadContext) -> None:
        """Compile at load (not at the first request): one predict per warmup batch size, then cache."""
        if self.config.runtime.mode != "compile":
            return
        sizes = set(self.config.warmup.batch_sizes) | {1}
        if self.config.max_batch_size >= 2:
            sizes.add(2)  # torch specialises size 1; 2 gives the dynamic graph every larger batch reuses
        with ctx.stage("compile"):
            for size in sorted(sizes):
                if self.config.max_batch_size == 0 and size != 1:
                    continue
                self.predict(self.collate([self.preprocess(self.warmup_inputs(size), {})]))
        if self._artifacts is not None and self.compile_cache == "miss":
            with ctx.stage("save_compile_cache"):
                if save_artifacts(self._artifacts):
                    self.compile_cache = "miss (written)"

    def load(self, ctx: LoadContext) -> None:
        params = self.config.parameters
        where = f"model {self.config.name!r} ({ctx.version_dir})"
        apply_num_threads(params, where)
        if "torchscript" in params:
            path = resolve_artifact(str(params["torchscript"]), ctx.version_dir, f"{where}.parameters.torchscript")
            with ctx.stage("read_weights"):
                data = path.read_bytes()
            with ctx.stage("build_session"):
                scripted = self._load_torchscript(data, path)
            self.module = self.apply_runtime(scripted, ctx, path)
            self.compile_now(ctx)
            return
        if "module" not in params:
            raise ModelLoadError(
                f"{where}: the torch backend needs `parameters: {{module: 'pkg.mod:Class', weights: "
                f"model.safetensors}}` or `parameters: {{torchscript: model.ts}}`"
            )
        cls = import_object(str(params["module"]), f"{where}.parameters.module")
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise ModelLoadError(f"{where}.parameters.module: {params['module']!r} is not a torch.nn.Module class")
        path = resolve_artifact(
            str(params.get("weights", "model.safetensors")), ctx.version_dir, f"{where}.parameters.weights"
        )
        refuse_pickle(path, params, f"{where}.parameters.weights")
        with ctx.stage("read_weights"):
            state = self._read_state(path, params)
        with ctx.stage("build_session"):
            kwargs = params.get("module_kwargs") or {}
            if not isinstance(kwargs, Mapping):
                raise ModelLoadError(f"{where}.parameters.module_kwargs: must be a mapping")
            module = cls(**kwargs)
            try:
                module.load_state_dict(state)
            except RuntimeError as exc:
                raise ModelLoadError(f"{path}: weights do not fit {params['module']}: {exc}") from None
        self.module = self.apply_runtime(module.eval(), ctx, path)
        self.compile_now(ctx)

    @staticmethod
    def _read_state(path: Path, params: Mapping[str, object]) -> Mapping[str, torch.Tensor]:
        if path.suffix == ".safetensors":
            return load_file(str(path), device="cpu")
        loaded = torch.load(str(path), map_location="cpu", weights_only=not pickle_allowed(params))
        if not isinstance(loaded, Mapping):
            raise ModelLoadError(f"{path}: expected a state dict (a mapping of tensors), got {type(loaded)}")
        return loaded

    @staticmethod
    def _load_torchscript(data: bytes, path: Path) -> torch.nn.Module:
        import io

        try:
            module: torch.nn.Module = torch.jit.load(io.BytesIO(data), map_location="cpu")  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise ModelLoadError(f"{path}: not a TorchScript file ({exc}); save it with torch.jit.save") from None
        return module.eval()

    def predict(self, batch: Arrays) -> Arrays:
        if self.module is None:
            raise RuntimeError(f"model {self.config.name!r} used before load()")
        args = [torch.from_numpy(np.ascontiguousarray(batch[spec.name])) for spec in self.config.inputs]
        if self.config.runtime.precision == "bf16":  # float inputs follow the module; outputs leave as fp32
            args = [a.to(torch.bfloat16) if a.is_floating_point() else a for a in args]
        with torch.inference_mode():
            result = self.module(*args)
        return self._outputs(result)

    def _outputs(self, result: Any) -> dict[str, np.ndarray]:
        names = [spec.name for spec in self.config.outputs]
        if self.config.runtime.precision == "bf16":
            result = _to_fp32(result)
        if isinstance(result, torch.Tensor):
            return {names[0]: result.numpy()}
        if isinstance(result, Mapping):
            return {k: v.numpy() for k, v in result.items() if k in names}
        if isinstance(result, tuple | list):
            return {n: t.numpy() for n, t in zip(names, result, strict=False)}
        raise TypeError(f"model {self.config.name!r}: the module returned {type(result)}, expected tensors")

    def unload(self) -> None:
        self.module = None


def _to_fp32(result: Any) -> Any:
    """bfloat16 tensors (alone, in a mapping or a sequence) back to float32: numpy has no bfloat16."""
    if isinstance(result, torch.Tensor):
        return result.float() if result.dtype == torch.bfloat16 else result
    if isinstance(result, Mapping):
        return {k: _to_fp32(v) for k, v in result.items()}
    if isinstance(result, tuple | list):
        return [_to_fp32(v) for v in result]
    return result
