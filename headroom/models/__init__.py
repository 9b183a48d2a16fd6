"""Model repository, backends (onnxruntime, torch, python) and the built-in default models."""
