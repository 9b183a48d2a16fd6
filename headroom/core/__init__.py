"""Shared contracts: clocks, errors, wire-neutral request/response types."""
