"""Native CPU kernels for the LLM engine (C sources built on first use, loaded with ctypes)."""
