"""`headroom sim --validate`'s comparison table (rich), from the JSON report `run_validation` returns."""

from __future__ import annotations

from typing import Any


def report_table(report: dict[str, Any]) -> Any:
    """The comparison as a rich Table (p50, p99 and mean batch size per load, real / simulated)."""
    from rich.table import Table

    ov, cap = report["overhead"], report["capacity"]
    other = "empirical" if report["config"]["overhead"] == "fixed" else "fixed"
    host_alt = "without" if report["config"]["host_cpu"] else "with"
    table = Table(title=f"headroom sim --validate: {report['model']}, {report['simulated']['batching']} batching; "
                  f"modelled overhead {ov['per_request_ms']:.2f} ms/request ({report['config']['overhead']}) "
                  f"+ {ov['per_batch_ms']:.2f} ms/batch; host CPU {ov['host_cpu_per_request_ms']:.2f} ms/request "
                  f"({'modelled' if report['config']['host_cpu'] else 'not modelled'}); in-service slowdown "
                  f"x{cap['service_time_scale']:.3f}; capacity isolated {cap['isolated_per_s']:,.1f} / effective "
                  f"{cap['effective_per_s']:,.1f} req/s")
    basis = report["config"].get("load_basis", "capacity")
    for col in ("target util" if basis == "utilisation" else "load", "rate/s", "util real/sim",
                "p50 real/sim ms", "err", "p99 real/sim ms", "err",
                f"p99 err ({other})", f"p50/p99 err ({host_alt} host CPU)", "batch real/sim", "verdict"):
        table.add_column(col, justify="right")

    def f(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for r in report["loads"]:
        e, real, sim = r["rel_error"], r["real"], r["sim"]
        verdict = ("[green]pass[/]" if r["pass"] else "[red]fail[/]") if r["judged"] else "reported"
        alt = r[f"sim_{other}_overhead"]["rel_error_p99"]
        h = r[f"sim_{host_alt}_host_cpu"]
        table.add_row(f"{r['load_fraction']:.0%}", f"{r['rate_per_s']:,.1f}",
                      f"{f(real.get('utilisation'), '.0%')} / {f(sim['utilisation'], '.0%')}",
                      f"{f(real['p50_ms'], '.2f')} / {f(sim['p50_ms'], '.2f')}", f(e["p50"], "+.1%"),
                      f"{f(real['p99_ms'], '.2f')} / {f(sim['p99_ms'], '.2f')}", f(e["p99"], "+.1%"), f(alt, "+.1%"),
                      f"{f(h['rel_error_p50'], '+.1%')} / {f(h['rel_error_p99'], '+.1%')}",
                      f"{f(real['mean_batch_size'], '.2f')} / {f(sim['mean_batch_size'], '.2f')}", verdict)
    table.caption = (f"err = (sim - real) / real; target |err| <= {report['config']['target_rel_error']:.0%} for "
                     f"p50 and p99 up to {report['config']['pass_up_to_load']:.0%} "
                     f"{'utilisation (the simulator picks each rate)' if basis == 'utilisation' else 'of capacity'};"
                     f" above it reported only; util = busy time / wall time")
    sat = cap.get("measured_saturation")
    if sat:
        table.caption += (f"\nmeasured saturation (closed loop, {sat['concurrency']} in flight): "
                          f"{sat['throughput_per_s']:,.1f} req/s at mean batch {sat['mean_batch_size']}, host CPU "
                          f"{sat['host_cpu_per_request_ms']} ms/request; effective capacity / measured = "
                          f"{sat['effective_over_measured']}")
    return table
