"""Wire protocols: KServe V2 / Open Inference Protocol over HTTP (JSON + binary extension) and gRPC.

Pure translation between bytes/protobufs and `headroom.core.types`; the HTTP app and the gRPC servicer
(`headroom.protocol.grpc_service`) are thin shells around these. See docs/protocol.md.
"""

from __future__ import annotations

from headroom.protocol import v2_http
from headroom.protocol.classification import classify
from headroom.protocol.v2_http import *  # noqa: F403 - the V2 HTTP codec; v2_http.__all__ names it

__all__ = ["classify"]
__all__ += v2_http.__all__
