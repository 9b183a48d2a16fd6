"""Every command other than `headroom ...` in the fenced blocks of README.md and docs/*.md, dry-run.

Which lines are commands (the blocks of test_docs_commands.py's FENCE, whose test checks the `headroom` ones):
in a fence tagged `bash`, `sh` or `shell`, every line but blank ones and `#` comments; in `console`, only the
lines starting with `$ ` (the rest is output); any other tag (`python`, `json`, `yaml`, ...) holds code or data,
never commands; an untagged fence is a command block (`console` if it starts with `$ `, else `bash`) when its
first line starts with `headroom` or a word a checker knows, else a diagram, a file tree or output, skipped.
Backslash continuations and lines inside an open quote (a multi-line `-d '{...}'`) are joined, `# ...` comments
dropped, leading `NAME=value` words are the environment. A command word without a checker in CHECKERS fails.
The dry runs: make: a Makefile rule, `make -n` passes, each `VAR=value` reaches the recipe. python -m M / a
script: `--help` after the subcommand words exits 0 and names each option of the line; `python -c CODE`
compiles and runs in an empty directory (cheap, offline) and each file it writes is used by another command
of the doc. pytest: options in `--help`, `-m` markers registered. curl: method + path match a route of
`headroom serve`'s HTTP app (its routing table, built without loading a model), `{model}` is a directory of
models/, a `-d` body is JSON (unless elided: `...`), each header is one headroom reads (a key header gives the
gateway a key). serve run module:builder k=v: the builder takes each k (validated by its pydantic model, as Ray
Serve does). A `*.sh` script: executable, `bash -n` clean, reads each variable set for it, and its options are
those of the `headroom` command it forwards "$@" to.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import typing
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError
from starlette.routing import BaseRoute, Match

from headroom.dashboard.routes import dashboard_routes
from headroom.gateway.asgi import presented_key
from headroom.server.app import Server, ServerConfig
from headroom.server.http_app import HttpApi, HttpLimits
from tests.cli.test_docs_commands import DOCS, FENCE, ROOT, reference_check


class DocCommandError(Exception):
    """A documented command that would not run as written."""


@dataclass
class Command:
    doc: Path
    text: str  # as written, continuations joined, `$ ` dropped
    words: list[str]  # shlex words, comments and leading NAME=value dropped ([] for an unclosed quote)
    env: dict[str, str]


def _command_lines(tag: str, block: str) -> list[str]:
    lines: list[str] = []
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        text = line.strip()
        if lines and _split(lines[-1]) is None:  # a quote still open: the command goes on
            lines[-1] += "\n" + line
        elif text and not text.startswith("#") and (tag != "console" or text.startswith("$ ")):
            lines.append(text.removeprefix("$ ").strip() if tag == "console" else text)
    return lines


def _split(text: str) -> tuple[list[str], dict[str, str]] | None:
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None
    env = list(itertools.takewhile(re.compile(r"[A-Za-z_]\w*=").match, words))
    return words[len(env):], dict(w.split("=", 1) for w in env)


def all_commands(path: Path) -> list[Command]:
    """Every command line of the doc's shell fences, `headroom ...` included."""
    found = []
    for match in FENCE.finditer(path.read_text()):
        tag, block = match.group(0).split("\n", 1)[0][3:].strip().lower(), match.group(1)
        if not tag:
            first = next((line.strip() for line in block.splitlines() if line.strip()), "")
            word = first.removeprefix("$ ").split(" ")[0]
            if not (first.startswith("$ ") or word == "headroom" or checker_for(word) is not None):
                continue  # a diagram, a file tree, output
            tag = "console" if first.startswith("$ ") else "bash"
        if tag in ("bash", "sh", "shell", "console"):
            found.extend(Command(path, line, *(_split(line) or ([], {}))) for line in _command_lines(tag, block))
    return found


def commands_in(path: Path) -> list[Command]:
    return [c for c in all_commands(path) if c.words[:1] != ["headroom"]]


@functools.cache
def _run(argv: tuple[str, ...], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(COLUMNS="200", NO_COLOR="1", TERM="dumb")
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=180, env=env)


def _help(argv: list[str]) -> str:
    done = _run(tuple(argv))
    if done.returncode != 0:
        raise DocCommandError(f"`{' '.join(argv)}` exits {done.returncode}: {(done.stderr or done.stdout)[-400:]}")
    return done.stdout + done.stderr


def _options_in(words: list[str], help_text: str, what: str) -> None:
    for word in words:
        option = word.split("=", 1)[0]
        known = re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text)
        if word.startswith("-") and not re.match(r"-\d", word) and option != "-" and not known:
            raise DocCommandError(f"{what} has no option {option} (not in its --help)")


def _leading(words: list[str]) -> list[str]:
    """The subcommand words (and positionals) before the first option."""
    return list(itertools.takewhile(lambda w: not w.startswith("-"), words))


def check_make(cmd: Command) -> None:
    args = cmd.words[1:]
    rules = {t for line in re.findall(r"^([^\s#:=][^:=]*?)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M)
             for t in line.split()}  # `make -n tests` passes too: the tests/ directory is "up to date"
    if unknown := [a for a in args if "=" not in a and not a.startswith("-") and a not in rules]:
        raise DocCommandError(f"No rule to make target {unknown[0]!r} in the Makefile")
    done = _run(("make", "-n", "-C", str(ROOT), *args))
    if done.returncode != 0:
        raise DocCommandError(f"`make -n {' '.join(args)}`: {done.stderr.strip()[-300:]}")
    for name, _, value in (a.partition("=") for a in args if "=" in a):
        if value not in done.stdout:
            raise DocCommandError(f"`{name}={value}` never reaches the recipe of `make {' '.join(args)}`")


def check_python(cmd: Command) -> None:
    args = cmd.words[1:]
    if args[:1] == ["-c"]:
        return _check_python_code(cmd, args[1])
    if args[:1] == ["-m"]:
        module, rest = args[1], args[2:]  # a missing module: `--help` below exits 1, "No module named"
        base, name = [sys.executable, "-m", module], f"python -m {module}"
    else:
        script, rest = ROOT / args[0], args[1:]
        if not script.is_file():
            raise DocCommandError(f"no script {args[0]}")
        if not re.search(r"\b(argparse|typer|click)\b", script.read_text()):  # --help would run it
            if rest:
                raise DocCommandError(f"{args[0]} parses no options: add a checker for it")
            compile(script.read_text(), str(script), "exec")
            return None
        base, name = [sys.executable, str(script)], args[0]
    _options_in(rest, _help([*base, *_leading(rest), "--help"]), " ".join([name, *_leading(rest)]))
    return None


def _check_python_code(cmd: Command, code: str) -> None:
    try:
        compile(code, "<doc>", "exec")
    except SyntaxError as exc:
        raise DocCommandError(f"python -c: {exc}") from None
    others = " ".join(c.text for c in all_commands(cmd.doc) if c.text != cmd.text)
    with tempfile.TemporaryDirectory() as tmp:
        done = _run((sys.executable, "-c", code), Path(tmp))
        if done.returncode != 0:
            raise DocCommandError(f"python -c exits {done.returncode}: {done.stderr[-400:]}")
        for written in sorted(Path(tmp).iterdir()):
            if not re.search(rf"(?<![\w.-]){re.escape(written.name)}(?![\w.-])", others):
                raise DocCommandError(f"python -c writes {written.name}: no other command of {cmd.doc.name} uses it")
            if written.suffix == ".npz":
                with np.load(written) as data:
                    assert data.files and all(data[k].size for k in data.files), f"{written.name} is empty"


def check_pytest(cmd: Command) -> None:
    rest = cmd.words[1:]
    _options_in(rest, _help([sys.executable, "-m", "pytest", "--help"]), "pytest")
    markers = _help([sys.executable, "-m", "pytest", "--markers"])
    for flag, expr in itertools.pairwise(rest):
        for name in set(re.findall(r"[A-Za-z_]\w*", expr)) - {"and", "or", "not"} if flag == "-m" else ():
            if f"@pytest.mark.{name}:" not in markers:
                raise DocCommandError(f"-m {expr}: no marker {name!r} is registered (pyproject.toml)")


@functools.cache
def server_routes() -> list[BaseRoute]:
    """The routes of `headroom serve`'s HTTP app, put together as `Server.run` does (HttpApi's, the LLM fleet's
    - served whenever the repository has an LLM, as models/ does - and the dashboard's); no model is loaded."""
    server = Server(ServerConfig())
    api = HttpApi(server.dataplane, server.registry, HttpLimits())
    return [*api.routes(), *server.llm.routes(), *dashboard_routes(registry=server.registry, clock=server.clock)]


@functools.cache
def _package_source() -> str:  # the headers headroom reads are named in it
    return "\n".join(p.read_text().lower() for p in (ROOT / "headroom").rglob("*.py"))


def check_curl(cmd: Command) -> None:
    stages = [list(g) for pipe, g in itertools.groupby(cmd.words, lambda w: w == "|") if not pipe]
    for stage in stages[1:]:
        if stage[:1] not in (["grep"], ["jq"], ["head"], ["tail"]):
            raise DocCommandError(f"curl piped into {stage[:1]}: add it to the curl checker")
    args, method, body, url = stages[0][1:], "", None, ""
    headers: list[tuple[bytes, bytes]] = []
    while args:
        word = args.pop(0)
        if word == "-X":
            method = args.pop(0)
        elif word == "-H":
            name, colon, value = args.pop(0).partition(":")
            if not colon:
                raise DocCommandError(f"-H {name!r} is not `Name: value`")
            headers.append((name.strip().lower().encode(), value.strip().encode()))
        elif word in ("-d", "--data", "--data-raw"):
            body = args.pop(0)
        elif word.startswith("-") and not re.fullmatch(r"-[sSifNv]+", word):
            raise DocCommandError(f"curl {word}: add it to the curl checker")
        elif not word.startswith("-"):
            url = word
    for name, _ in headers:
        if name.decode() not in _package_source():
            raise DocCommandError(f"header {name.decode()!r}: headroom never reads it")
    if any(n in (b"authorization", b"x-api-key") for n, _ in headers) and presented_key(headers) is None:
        raise DocCommandError("the gateway finds no API key in these headers")
    if body is not None and "..." not in body:
        try:
            parsed = json.loads(body)
            config = parsed.get("parameters", {}).get("config") if isinstance(parsed, dict) else None
            json.loads(config) if isinstance(config, str) else None  # a repository load's config override
        except json.JSONDecodeError as exc:
            raise DocCommandError(f"the -d body is not JSON: {exc}") from None
    if not url:
        raise DocCommandError("curl without a URL")
    if url == "...":  # `curl -H "Authorization: ..." ...`: the URL elided
        return
    parts = urlsplit(url if "://" in url else "http://" + url)
    if parts.port != ServerConfig().http_port:
        raise DocCommandError(f"{url}: not headroom serve's HTTP port; add a checker for that server")
    method = method or ("POST" if body is not None else "GET")
    scope = {"type": "http", "path": parts.path or "/", "root_path": "", "method": method}
    matched = [(m, child) for m, child in (r.matches(scope) for r in server_routes()) if m is not Match.NONE]
    full = [child for m, child in matched if m is Match.FULL]
    if not full:
        raise DocCommandError(f"{method} {parts.path}: " + ("the route takes another method" if matched
                                                            else "headroom serve has no such route"))
    model = full[0].get("path_params", {}).get("model")
    if model is not None and not (ROOT / "models" / model / "config.yaml").is_file():
        raise DocCommandError(f"{parts.path}: no model directory models/{model}")


def check_serve(cmd: Command) -> None:
    args = cmd.words[1:]
    if args[:1] != ["run"]:
        raise DocCommandError(f"serve {args[:1]}: only `serve run` has a checker")
    cli = str(Path(sys.executable).parent / "serve")
    _options_in(args[1:], _help([cli, "run", "--help"]), "serve run")
    target = next(w for w in args[1:] if not w.startswith("-"))
    module, _, attr = target.partition(":")
    try:
        builder = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise DocCommandError(f"{target}: {exc}") from None
    given = dict(w.split("=", 1) for w in args if "=" in w and not w.startswith("-"))
    params = list(inspect.signature(builder).parameters.values())
    model = typing.get_type_hints(builder).get(params[0].name) if len(params) == 1 else None
    if isinstance(model, type) and issubclass(model, BaseModel):  # Serve validates the k=v args with it
        if unknown := sorted(set(given) - set(model.model_fields)):
            raise DocCommandError(f"{target} takes no argument {unknown[0]!r}")
        try:
            parsed = model.model_validate(given)
        except ValidationError as exc:
            raise DocCommandError(f"{target}: {exc}") from None
        getattr(parsed, "spec", lambda: None)()
    elif (unknown := sorted(set(given) - {p.name for p in params})) and all(p.kind != p.VAR_KEYWORD for p in params):
        raise DocCommandError(f"{target} takes no argument {unknown[0]!r}")


def check_script(cmd: Command) -> None:
    script = ROOT / cmd.words[0]
    if not script.is_file() or not os.access(script, os.X_OK):
        raise DocCommandError(f"{cmd.words[0]}: no such executable script")
    if (done := _run(("bash", "-n", str(script)))).returncode != 0:
        raise DocCommandError(f"bash -n {cmd.words[0]}: {done.stderr}")
    source = script.read_text()
    for name in cmd.env:
        if not re.search(rf"\$\{{?{name}\b", source):
            raise DocCommandError(f"{cmd.words[0]} never reads ${name}")
    options = [w for w in cmd.words[1:] if w.startswith("-")]
    if options:
        forward = next((line for line in re.sub(r"\\\n\s*", " ", source).splitlines() if '"$@"' in line), "")
        sub = re.search(r"(?:headroom|-m headroom\.cli\.main)((?: [a-z][\w-]*)+)", forward)
        if sub is None:
            raise DocCommandError(f"{cmd.words[0]} forwards its options to no headroom command: add a checker")
        try:
            reference_check([*sub.group(1).split(), *options])
        except ValueError as exc:
            raise DocCommandError(f"{cmd.words[0]} passes them to headroom: {exc}") from None


CHECKERS: dict[str, Callable[[Command], None]] = {
    "make": check_make, "curl": check_curl, "serve": check_serve, "pytest": check_pytest,
    ".venv/bin/pytest": check_pytest, **dict.fromkeys(("python", "python3", ".venv/bin/python"), check_python),
}


def checker_for(word: str) -> Callable[[Command], None] | None:
    return CHECKERS.get(word) or (check_script if word.endswith(".sh") else None)


def check(cmd: Command) -> None:
    if not cmd.words:
        raise DocCommandError("a quote is never closed")
    checker = checker_for(cmd.words[0])
    if checker is None:
        raise DocCommandError(f"no checker for `{cmd.words[0]}` commands: add a dry run for it to CHECKERS in "
                              "tests/cli/test_docs_other_commands.py")
    checker(cmd)


CASES = list({(c.doc, c.text): c for p in DOCS for c in commands_in(p)}.values())


def test_the_docs_name_these_commands() -> None:
    counts = Counter(getattr(checker_for((c.words or ["?"])[0]), "__name__", "?") for c in CASES)
    least = dict(check_make=4, check_curl=10, check_python=10, check_serve=1, check_script=3, check_pytest=1)
    assert all(counts[kind] >= n for kind, n in least.items()), counts
    texts = {" ".join(cmd.words) for cmd in CASES}
    assert "python -m headroom.router.bench scale" in texts and "make test" in texts


@pytest.mark.parametrize("cmd", CASES, ids=[f"{c.doc.relative_to(ROOT)}:{c.text[:60]}" for c in CASES])
def test_documented_command_dry_runs(cmd: Command) -> None:
    try:
        check(cmd)
    except DocCommandError as exc:
        pytest.fail(f"{cmd.doc.relative_to(ROOT)}: `{cmd.text}`: {exc}")


def test_which_lines_are_commands(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("```python\nmake nothing\n```\n```console\n$ make serve\nmake output line\n```\n"
                   "```\nclient ─► make it\n```\n```\ncurl -s localhost:8000/metrics\n```\n"
                   "```bash\n# a comment\nwget x  # y\nheadroom serve\n```\n")
    assert [c.text for c in commands_in(doc)] == ["make serve", "curl -s localhost:8000/metrics", "wget x  # y"]
    with pytest.raises(DocCommandError, match="no checker for `wget`"):
        check(commands_in(doc)[-1])


RUN = "$ TAG=pinned benchmarks/sim_validation/run.sh minilm"
REJECTS = [  # (doc, text as written, the same line mistyped, what the checker says)
    ("README.md", 'make test PYTEST_ARGS="-k', 'make tests PYTEST_ARGS="-k', "No rule to make target"),
    ("README.md", 'PYTEST_ARGS="-k batch"', 'PYTEST_ARG="-k batch"', "never reaches the recipe"),
    ("README.md", ".venv/bin/pytest -m slow", ".venv/bin/pytest -m slo", "no marker 'slo'"),
    ("README.md", ".venv/bin/pytest -m slow", ".venv/bin/pytset -m slow", "no checker for"),
    ("README.md", ".venv/bin/pytest -m slow", ".venv/bin/pytest --slow", "pytest has no option --slow"),
    ("docs/serving.md", "8000/v2/models/minilm/config", "8000/v2/model/minilm/config", "no such route"),
    ("docs/serving.md", "-X POST localhost:8000/v2/repo", "-X GET localhost:8000/v2/repo", "takes another method"),
    ("docs/serving.md", "/v2/models/smollm2/stats", "/v2/models/smolm2/stats", "no model directory"),
    ("docs/serving.md", '16}"}}', '16}"}', "not JSON"),
    ("docs/structured_output.md", '"max_tokens": 64,', '"max_tokens": 64,,', "not JSON"),
    ("docs/gateway.md", 'curl -H "Authorization: Bearer', 'curl -H "Authorisation: Bearer', "never reads it"),
    ("docs/gateway.md", 'curl -H "Authorization: Bearer', 'curl -H "Authorization: Basic', "no API key"),
    ("docs/models.md", "--batch-sizes 1 32 --seconds 5", "--batch-sizes 1 32 --secs 5", "no option --secs"),
    ("docs/models.md", "headroom.models.measure --model", "headroom.model.measure --model", "No module named"),
    ("docs/router.md", "bench sim     #", "bench simm     #", "exits 2"),
    ("docs/serving.md", "--repeats 3 --tag issue2   #", "--repaets 3 --tag issue2   #", "no option --repaets"),
    ("docs/lifecycle.md", "np.savez('digits.npz'", "np.savez('digitz.npz'", "writes digitz.npz"),
    ("docs/lifecycle.md", "import numpy as np;", "import numpy as np;;", "invalid syntax"),
    ("docs/ray.md", "minilm replicas=2", "minilm replica=2", "no argument 'replica'"),
    ("docs/ray.md", "minilm replicas=2", "minilm replicas=two", "valid integer"),
    ("docs/sim.md", f"{RUN} 30 --server-cpus", f"{RUN} 30 --server-cpu", "no option --server-cpu"),
    ("docs/sim.md", RUN, RUN.replace("TAG", "TAGS"), r"never reads \$TAGS"),
]


@pytest.mark.parametrize(("doc", "old", "new", "message"), REJECTS, ids=[f"{d}:{n[:40]}" for d, _, n, _ in REJECTS])
def test_the_checker_rejects(tmp_path: Path, doc: str, old: str, new: str, message: str) -> None:
    """The same doc in a temporary copy with one line mistyped: the changed command fails its dry run."""
    text = (ROOT / doc).read_text()
    assert text.count(old) == 1, f"{doc} no longer has exactly one {old!r}: update this case"
    copy = tmp_path / Path(doc).name
    copy.write_text(text.replace(old, new))
    before = {c.text for c in commands_in(ROOT / doc)}
    changed = [c for c in commands_in(copy) if c.text not in before]
    assert len(changed) == 1, [c.text for c in changed]
    with pytest.raises(DocCommandError, match=message):
        check(changed[0])
