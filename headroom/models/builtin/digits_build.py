"""Train the digits CNN on scikit-learn's bundled digits and export it to ONNX and safetensors.

Deterministic: a fixed seed drives the split, the initialisation and the shuffling (torch's global RNG is
forked, not disturbed). Idempotent: `build.json` records a fingerprint of the training code and settings;
when it matches and the artifacts exist, the build is skipped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from safetensors.torch import save_file
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from headroom.models.builtin import digits_net, digits_transform
from headroom.models.builtin.build_record import install, is_current, read_record
from headroom.models.builtin.digits_net import DigitsNet
from headroom.models.builtin.digits_transform import to_model_input

ARTIFACTS = ("model.onnx", "model.safetensors", "build.json")  # what a build writes into the version dir
MIN_ACCURACY = 0.95  # a build below this held-out accuracy fails


@dataclass(frozen=True, slots=True)
class DigitsTrainingConfig:
    """Training settings; all of them are part of the build fingerprint."""

    seed: int = 0  # drives the split, the initialisation and the shuffling
    test_fraction: float = 0.2  # held-out share of the 1797 images (stratified)
    epochs: int = 30  # passes over the training split
    batch_size: int = 64  # images per optimiser step
    learning_rate: float = 2e-3  # Adam step size
    channels: int = 32  # first conv layer's channels (second has twice as many)
    hidden: int = 128  # width of the hidden fully connected layer
    num_threads: int = 1  # torch threads while training (1 keeps results bit-for-bit reproducible)


@dataclass(frozen=True, slots=True)
class DigitsBuildReport:
    """What `build_digits` did."""

    version_dir: Path  # where the artifacts are
    accuracy: float  # held-out accuracy of the exported ONNX model (0..1)
    num_test: int  # held-out images it was measured on
    skipped: bool  # True when matching artifacts already existed
    duration_s: float  # wall time of this call
    fingerprint: str  # hash of the training code and settings


def held_out_split(cfg: DigitsTrainingConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_images, train_labels, test_images, test_labels); images [N, 8, 8] in 0..16, labels int64."""
    data = load_digits()
    images = np.asarray(data.images, dtype=np.float32)
    labels = np.asarray(data.target, dtype=np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=cfg.test_fraction, random_state=cfg.seed, stratify=labels
    )
    return x_train, y_train, x_test, y_test


def fingerprint(cfg: DigitsTrainingConfig) -> str:
    """Hash of everything that determines the artifacts: this code, the network, the transform, the settings."""
    digest = hashlib.sha256()
    for module in (digits_transform, digits_net):
        digest.update(inspect.getsource(module).encode())
    for func in (held_out_split, train, export_onnx, build_digits):
        digest.update(inspect.getsource(func).encode())
    digest.update(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    digest.update(torch.__version__.encode())
    return digest.hexdigest()[:16]


def train(cfg: DigitsTrainingConfig, on_epoch: Callable[[int, float], None] | None = None) -> DigitsNet:
    """Train on the training split; `on_epoch(epoch, loss)` reports progress."""
    x_train, y_train, _, _ = held_out_split(cfg)
    inputs = torch.from_numpy(to_model_input(x_train))
    targets = torch.from_numpy(y_train)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            net = DigitsNet(cfg.channels, cfg.hidden)
            optimiser = torch.optim.Adam(net.parameters(), lr=cfg.learning_rate)
            loss_fn = torch.nn.CrossEntropyLoss()
            shuffle = torch.Generator().manual_seed(cfg.seed)
            net.train()
            for epoch in range(cfg.epochs):
                order = torch.randperm(len(inputs), generator=shuffle)
                total = 0.0
                for start in range(0, len(order), cfg.batch_size):
                    idx = order[start : start + cfg.batch_size]
                    optimiser.zero_grad()
                    loss = loss_fn(net.logits(inputs[idx]), targets[idx])
                    loss.backward()
                    optimiser.step()
                    total += loss.item() * len(idx)
                if on_epoch is not None:
                    on_epoch(epoch + 1, total / len(inputs))
    finally:
        torch.set_num_threads(previous_threads)
    return net.eval()


def export_onnx(net: DigitsNet, path: Path) -> None:
    """ONNX with input `input` [batch, 1, 8, 8] and output `probabilities` [batch, 10], dynamic batch axis."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (torch.zeros(2, 1, 8, 8),),
            str(path),
            input_names=["input"],
            output_names=["probabilities"],
            dynamic_axes={"input": {0: "batch"}, "probabilities": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )


def onnx_accuracy(path: Path, images: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of an exported ONNX file on [N, 8, 8] images (0..16 scale)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (probs,) = session.run(["probabilities"], {"input": to_model_input(images)})
    return float((np.argmax(probs, axis=1) == labels).mean())


def is_built(version_dir: Path, cfg: DigitsTrainingConfig | None = None) -> bool:
    """True when every artifact exists and build.json carries the current fingerprint."""
    cfg = cfg or DigitsTrainingConfig()
    return is_current(version_dir, ARTIFACTS, lambda: fingerprint(cfg))


def build_digits(
    version_dir: Path,
    cfg: DigitsTrainingConfig | None = None,
    *,
    force: bool = False,
    on_epoch: Callable[[int, float], None] | None = None,
) -> DigitsBuildReport:
    """Train and export into `version_dir` unless matching artifacts exist; raises if accuracy < 95%."""
    cfg = cfg or DigitsTrainingConfig()
    start = time.monotonic()
    digest = fingerprint(cfg)
    _, _, x_test, y_test = held_out_split(cfg)
    if not force and is_built(version_dir, cfg):
        recorded = read_record(version_dir) or {}
        return DigitsBuildReport(
            version_dir, float(recorded["accuracy"]), len(y_test), True, time.monotonic() - start, digest
        )
    net = train(cfg, on_epoch)
    version_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=version_dir, prefix=".build-") as tmp:
        staging = Path(tmp)
        export_onnx(net, staging / "model.onnx")
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(staging / "model.safetensors"))
        accuracy = onnx_accuracy(staging / "model.onnx", x_test, y_test)
        if accuracy < MIN_ACCURACY:
            raise RuntimeError(f"digits: held-out accuracy {accuracy:.3f} < {MIN_ACCURACY}; not installing it")
        record = {
            "fingerprint": digest,
            "accuracy": accuracy,
            "num_test": len(y_test),
            "training": dataclasses.asdict(cfg),
            "torch": torch.__version__,
        }
        install(staging, version_dir, ARTIFACTS, record)
    return DigitsBuildReport(version_dir, accuracy, len(y_test), False, time.monotonic() - start, digest)
