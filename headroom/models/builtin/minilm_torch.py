"""minilm's torch encoder (backend: torch): `MiniLMModel`, BertModel run eagerly by PyTorch.

Apart from `headroom.models.builtin.minilm` (tokenization, pooling and the onnxruntime model) so that the default
onnxruntime model never imports torch or transformers. `headroom.models.builtin.minilm:MiniLMModel` still names
this class (the module forwards the name).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertModel

from headroom.models.artifacts import ModelLoadError
from headroom.models.backends.torch_backend import TorchModel, apply_num_threads
from headroom.models.base import LoadContext
from headroom.models.builtin.minilm import SentenceEmbedding


def load_bert(directory: Path) -> BertModel:
    """BertModel (no pooler) in eval mode with the directory's safetensors weights."""
    state = load_file(str(directory / "model.safetensors"), device="cpu")
    bert = BertModel(BertConfig.from_pretrained(str(directory), local_files_only=True), add_pooling_layer=False)
    state = {k: v for k, v in state.items() if not k.startswith("pooler.") and not k.endswith("position_ids")}
    missing, unexpected = bert.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith("position_ids")]:
        raise ModelLoadError(f"{directory}: weights do not fit BertModel (missing {missing}, unexpected {unexpected})")
    bert.eval()  # type: ignore[no-untyped-call]
    return bert


class MiniLMModel(SentenceEmbedding, TorchModel):
    """The encoder run eagerly by PyTorch (backend: torch)."""

    bert: BertModel | None = None

    def load(self, ctx: LoadContext) -> None:
        apply_num_threads(self.config.parameters, f"model {self.config.name!r} ({ctx.version_dir})")
        with ctx.stage("read_weights"):
            directory = self._load_tokenizer(ctx)
        with ctx.stage("build_session"):
            self.bert = load_bert(directory)
        self.module = self.bert

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        if self.bert is None:
            raise RuntimeError("minilm used before load()")
        ids = torch.from_numpy(np.ascontiguousarray(input_ids))
        mask = torch.from_numpy(np.ascontiguousarray(attention_mask))
        with torch.inference_mode():
            hidden = self.bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))
        result: np.ndarray = hidden.last_hidden_state.numpy()
        return result

    def unload(self) -> None:
        self.bert = None
        self.module = None
        self.tokenizer = None
