"""Dynamic batching: a pure policy (`policy.decide`) and the small asyncio mechanism around it."""
