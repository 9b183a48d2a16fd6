"""The `torch` backend: safetensors weights into a module class named in the config, or a TorchScript file.

Parameters::

    module: mypackage.nets:MyNet      # importable "module:Class" (an nn.Module); with `weights`
    module_kwargs: {hidden: 128}      # keyword arguments for the class (optional)
    weights: model.safetensors        # state dict; .pt/.pth/.bin/.pkl need `allow_pickle: true`
    torchscript: model.ts             # alternative to module + weights: a torch.jit.save'd file
    num_threads: 2                    # torch intra-op threads (process-wide in PyTorch; optional)

`predict` calls the module with the batch's tensors positionally in the config's input order, under
`torch.inference_mode()` in eval mode. A tensor result is the first declared output; a tuple maps to the
declared outputs in order; a dict maps by name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from headroom.models.artifacts import (
    ModelLoadError,
    int_parameter,
    pickle_allowed,
    refuse_pickle,
    resolve_artifact,
)
from headroom.models.base import Arrays, LoadContext, Model


def import_object(ref: str, where: str) -> Any:
    """Import `package.module:Name`; raises ModelLoadError explaining the expected form."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ModelLoadError(f"{where}: {ref!r} must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadError(f"{where}: cannot import {module_name!r} ({exc}); is it installed?") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ModelLoadError(f"{where}: module {module_name!r} has no attribute {attr!r}") from None


def apply_num_threads(parameters: Mapping[str, object], where: str) -> None:
    """Set torch's intra-op thread count when the config asks for one (PyTorch keeps it per process)."""
    threads = int_parameter(parameters, "num_threads", 0, where)
    if threads > 0:
        torch.set_num_threads(threads)


class TorchModel(Model):
    """Runs a PyTorch module (eager with safetensors weights, or TorchScript) on the CPU."""

    module: torch.nn.Module | None = None

    def load(self, ctx: LoadContext) -> None:
        params = self.config.parameters
        where = f"model {self.config.name!r} ({ctx.version_dir})"
        apply_num_threads(params, where)
        if "torchscript" in params:
            path = resolve_artifact(str(params["torchscript"]), ctx.version_dir, f"{where}.parameters.torchscript")
            with ctx.stage("read_weights"):
                data = path.read_bytes()
            with ctx.stage("build_session"):
                self.module = self._load_torchscript(data, path)
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
            self.module = module.eval()

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
        with torch.inference_mode():
            result = self.module(*args)
        return self._outputs(result)

    def _outputs(self, result: Any) -> dict[str, np.ndarray]:
        names = [spec.name for spec in self.config.outputs]
        if isinstance(result, torch.Tensor):
            return {names[0]: result.numpy()}
        if isinstance(result, Mapping):
            return {k: v.numpy() for k, v in result.items() if k in names}
        if isinstance(result, tuple | list):
            return {n: t.numpy() for n, t in zip(names, result, strict=False)}
        raise TypeError(f"model {self.config.name!r}: the module returned {type(result)}, expected tensors")

    def unload(self) -> None:
        self.module = None
