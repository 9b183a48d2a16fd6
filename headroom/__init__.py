"""headroom: model serving that keeps its latency SLOs and says, with numbers, what hardware a load needs."""

__version__ = "0.1.0"
__all__ = ["__version__"]
