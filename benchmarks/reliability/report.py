"""The suite's results as the markdown table pasted into BENCHMARKS.md, each figure next to its target."""

from __future__ import annotations

from typing import Any


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _row(what: str, measured: str, target: str, ok: bool | None) -> str:
    verdict = "n/a" if ok is None else ("yes" if ok else "**no**")
    return f"| {what} | {measured} | {target} | {verdict} |"


def _le(value: Any, limit: float) -> bool | None:
    return None if value is None else bool(value <= limit)


def _spent(fuzz: dict[str, Any]) -> str:
    return ", time budget spent" if fuzz.get("out_of_time") else ""


def _grpc_kinds(g: dict[str, Any]) -> str:
    """Server errors of each kind of gRPC case out of that kind's cases, and how many were served (OK): a
    fuzz whose well-formed requests never reach a model says so."""
    parts = []
    for kind, label in (("structured", "protobuf"), ("served", "valid for a model"), ("garbage", "undecodable")):
        if f"server_errors_{kind}" not in g:  # results from before that kind of case existed
            continue
        codes = g.get("by_code", {}).get(kind, {})
        parts.append(f"{label}: {g[f'server_errors_{kind}']} of {sum(codes.values())}, {codes.get('OK', 0)} OK")
    return "; ".join(parts)


def markdown(r: dict[str, Any]) -> str:
    rows = ["| scenario | measured | target | met |", "|---|---|---|---|"]
    if "overload" in r:
        o = r["overload"]
        load = f"{_f(o['offered_per_s'])}/s offered vs {_f(o['capacity_per_s'])}/s capacity, {_f(o['duration_s'], 0)} s"
        if o.get("client_lag_p99_ms") is not None:
            load += (f"; client lag p99 {_f(o['client_lag_p99_ms'])} ms, client CPU "
                     f"{_f(100 * o['client_cpu_share'], 0)}%")
        rows.append(_row(f"overload ({load}): rejection p99", f"{_f(o['rejection_p99_ms'])} ms", "<= 20 ms",
                         _le(o["rejection_p99_ms"], 20.0)))
        rows.append(_row("overload: accepted p99", f"{_f(o['accepted_p99_ms'])} ms", f"<= {_f(o['slo_ms'], 0)} ms",
                         _le(o["accepted_p99_ms"], o["slo_ms"])))
        ratio = o["goodput_vs_capacity"]
        rows.append(_row("overload: goodput vs capacity", f"{_f(None if ratio is None else 100 * ratio)}%", ">= 90%",
                         None if ratio is None else ratio >= 0.9))
        rows.append(_row("overload: connection errors", str(o["connection_errors"]), "0", o["connection_errors"] == 0))
    if "storm" in r:
        st = r["storm"]
        ratio = st["accepted_vs_capacity"]
        rows.append(_row(f"retry storm ({st['connections']} connections re-sending at once on a 503, "
                         f"{_f(st['duration_s'], 0)} s; {_f(st['refused_per_s'], 0)} refusals/s): accepted",
                         f"{_f(st['accepted_per_s'])}/s = {_f(None if ratio is None else 100 * ratio)}% of "
                         f"{_f(st['capacity_per_s'])}/s capacity", ">= 50%", None if ratio is None else ratio >= 0.5))
    for key, label in (("kill_9", "replica kill -9"), ("sigterm", "replica SIGTERM")):
        if "failover" in r:
            f = r["failover"][key]
            rows.append(_row(f"{label} ({_f(f['rate_per_s'], 0)}/s, {_f(f['duration_s'], 0)} s): requests lost",
                             f"{f['lost']} lost + {f['shed']} shed of {f['requests']}", "0 of >= 2,000",
                             f["lost"] + f["shed"] == 0 and f["requests"] >= 2000))
    if "streams" in r:
        s = r["streams"]
        never = f"not within {_f(s['timeout_s'], 0)} s"
        for key, what in (("running_zero_after_ms", f"{s['streams']} abandoned LLM streams: running = 0 after"),
                          ("kv_idle_after_ms", "abandoned streams: KV usage back to idle after")):
            value = s[key]
            rows.append(_row(what, never if value is None else f"{value:.1f} ms", "<= 100 ms",
                             value is not None and value <= 100.0))
    if "fuzz" in r:
        z = r["fuzz"]
        h, g = z["http"], z["grpc"]
        rows.append(_row(f"fuzz HTTP ({h['cases']} cases{_spent(h)}, {h['operations']} operations): >= 500",
                         str(h["responses_5xx"]), "0 of >= 10,000", h["responses_5xx"] == 0 and h["cases"] >= 10_000))
        rows.append(_row(f"fuzz gRPC ModelInfer ({g['cases']} cases{_spent(g)}): INTERNAL/UNKNOWN",
                         f"{g['server_errors']} ({_grpc_kinds(g)})", "0 of >= 10,000",
                         g["server_errors"] == 0 and g["cases"] >= 10_000))
        rows.append(_row("fuzz: server RSS growth", f"{_f(z['rss_growth_mb'])} MB", "< 50 MB",
                         None if z["rss_growth_mb"] is None else z["rss_growth_mb"] < 50))
    return "\n".join(rows) + "\n"
