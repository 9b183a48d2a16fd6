"""The inference server: composition root, data plane, HTTP app, metrics."""
