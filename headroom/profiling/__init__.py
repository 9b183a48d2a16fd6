"""`headroom profile`: measure a model's service time by batch size on this machine."""
