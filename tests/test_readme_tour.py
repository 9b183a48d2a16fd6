"""README.md's "A five-minute tour", run as written against the real server on the default repository: every curl
line (its URL, headers and body, sent with httpx so that the test needs no curl binary; a trailing `| grep` applied
to the body) and every Python block (in a fresh interpreter), with only the ports changed to the test server's."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import RunningServer, run_server

REPO = Path(__file__).resolve().parents[1]


def _tour_blocks() -> list[tuple[str, str]]:
    """(language, code) of each fenced block between the tour's heading and the next one."""
    text = (REPO / "README.md").read_text()
    tour = text.split("## A five-minute tour", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    return [(lang, code) for lang, code in re.findall(r"```(\w+)\n(.*?)```", tour, flags=re.S)]


def _curl_commands(code: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", code)
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip().startswith("curl ")]


def _run_curl(command: str, base: str) -> tuple[httpx.Response, str]:
    """One README curl line with httpx: -s / -si, -H, -d (POST), then an optional `| grep PATTERN` on the body."""
    command, _, grep = command.partition("|")
    words = shlex.split(command)[1:]
    headers: dict[str, str] = {}
    body: str | None = None
    url = ""
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-H":
            name, _, value = words[i + 1].partition(":")
            headers[name.strip()] = value.strip()
            i += 2
        elif word == "-d":
            body, i = words[i + 1], i + 2
        elif word.startswith("-"):
            if set(word[1:]) - {"s", "i"}:
                raise AssertionError(f"the tour uses a curl flag this test does not translate: {word}")
            i += 1
        else:
            url, i = word, i + 1
    url = "http://" + url.replace("localhost:8000", base) if not url.startswith("http") else url
    response = httpx.request("POST" if body is not None else "GET", url, headers=headers, content=body, timeout=120)
    out = response.text
    if grep.strip():
        pattern = shlex.split(grep)[1]
        out = "\n".join(line for line in out.splitlines() if pattern in line)
    return response, out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(REPO / "models", tmp_path_factory.mktemp("tour")) as running:
        yield running


def test_the_tour_has_what_this_test_runs() -> None:
    langs = [lang for lang, _ in _tour_blocks()]
    assert langs.count("bash") >= 3 and langs.count("python") >= 2, langs
    assert sum(len(_curl_commands(code)) for lang, code in _tour_blocks() if lang == "bash") >= 5


def test_every_curl_line_of_the_tour_answers(server: RunningServer) -> None:
    for lang, code in _tour_blocks():
        if lang != "bash":
            continue
        for command in _curl_commands(code):
            response, out = _run_curl(command, server.http_target)
            assert response.status_code == 200, f"{command}\n{response.status_code} {response.text[:300]}"
            assert out.strip(), command
            if "/v1/embeddings" in command:
                data = response.json()["data"]
                assert len(data) == 2 and len(data[0]["embedding"]) == 384
            if "/infer" in command:
                assert "server-timing" in response.headers and response.json()["outputs"]
            if "grep headroom_" in command:
                assert any(line.startswith("headroom_") for line in out.splitlines())


def test_every_python_block_of_the_tour_runs(server: RunningServer) -> None:
    outputs = []
    for lang, code in _tour_blocks():
        if lang != "python":
            continue
        code = code.replace("127.0.0.1:8001", server.grpc_target).replace("127.0.0.1:8000", server.http_target)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{code}\n{done.stderr[-2000:]}"
        outputs.append(done.stdout)
    assert outputs[0].strip() == "(2, 384)"  # the Triton client's embedding shape, as the comment says
    assert outputs[1].strip()  # the chat streamed some text
