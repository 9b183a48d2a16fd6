"""The private descriptor pool the generated modules register into (see headroom/protocol/gen_grpc.py).

Keeping `inference.*` out of protobuf's default pool lets this package and `tritonclient.grpc` (which
defines the same symbols) live in one process.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
