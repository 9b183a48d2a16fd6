"""Model lifecycle pieces: precision variants and their accuracy gate, the precision cascade, input-drift
monitoring, offline (static) inference with a prediction store, and the memory-budget LRU policy."""
