"""Capacity planning from closed forms: queueing, batching, replicas, cost and LLM sizing.

Everything here is pure math on plain numbers (seconds, requests per second, bytes, dollars). The CLI
(`headroom plan ...`) formats these results; the simulator (`headroom.sim`) checks them.
"""
