"""The start banner prints URLs a user can paste: https:// when TLS is on."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from headroom.cli.serve import _banner


def _server(tls: object) -> SimpleNamespace:
    config = SimpleNamespace(host="127.0.0.1", tls=tls)
    dataplane = SimpleNamespace(model_names=lambda: ["digits", "minilm"])
    return SimpleNamespace(config=config, http_port=8443, grpc_port=8001, dataplane=dataplane,
                           llm_model_names=lambda: [])


@pytest.mark.parametrize(("tls", "scheme"), [(None, "http"), (SimpleNamespace(certfile=Path("c.pem")), "https")])
def test_every_url_in_the_banner_uses_the_served_scheme(tls: object, scheme: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _banner(_server(tls))  # type: ignore[arg-type]
    err = capsys.readouterr().err
    urls = [word for word in err.split() if "://" in word]
    assert len(urls) >= 4 and all(u.startswith(f"{scheme}://127.0.0.1:8443") for u in urls), err
