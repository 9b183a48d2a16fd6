"""Replica routing: pure policies (routing, health, tail tolerance, rollout) and the proxy applying them."""
