"""benchmarks/RESULTS.md: the measured section, written from results.json; notes outside kept."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

BEGIN = "<!-- measured:begin (written by benchmarks/run.py) -->"
END = "<!-- measured:end -->"
EDGE, TRITON, FLOOR, OV = (
    "edgeserve (ort)",
    "triton (ort)",
    "floor (ort)",
    "edgeserve (openvino auto)",
)


def write_results(results: dict[str, Any], path: Path) -> None:
    measured = "\n".join([BEGIN, *render(results), END])
    text = (
        path.read_text(encoding="utf-8")
        if path.exists()
        else f"# Benchmark results\n\n{BEGIN}\n{END}\n"
    )
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    path.write_text(head + measured + tail, encoding="utf-8")


def render(r: dict[str, Any]) -> list[str]:
    settings = r["settings"]
    lines = [
        f"Measured {r['date']} with `{r['command']}`; windows of {settings['window_s']} s after "
        f"{settings['warmup_s']} s of warm-up, {settings['rounds']} rounds alternating the "
        "servers, medians. Every server gets Triton's binary tensor extension (in and out).",
        "",
    ]
    if r["triton"]:
        lines += [f"**Triton did not run:** {r['triton']}", ""]
    lines += (
        _targets(r)
        + _limits(r)
        + _serving(r)
        + _several_items(r)
        + _cpu(r)
        + _threading(r)
        + _slo(r)
        + _simulation(r)
        + _coldstart(r)
        + _memory(r)
    )
    return lines


def _f(value: float, digits: int = 0) -> str:
    return "-" if value != value else f"{value:.{digits}f}"


def _limits(r: dict[str, Any]) -> list[str]:
    sizes = sorted({int(s) for row in r["limit"] for s in row["by_size"]})
    lines = ["## The limit: in-process items/s by batch size (no HTTP)", ""]
    lines += [
        "| model | backend | " + " | ".join(f"b={s}" for s in sizes) + " | best |",
        "|---" * (len(sizes) + 3) + "|",
    ]
    for row in r["limit"]:
        cells = [
            _f(row["by_size"][s] if s in row["by_size"] else row["by_size"][str(s)]) for s in sizes
        ]
        lines.append(
            f"| {row['model']} | {row['backend']} {row['precision']} | "
            + " | ".join(cells)
            + f" | **{_f(row['best'][1])}** |"
        )
    lines += [
        "",
        "OpenVINO `auto` (bf16 on this CPU) against fp32, max abs output difference "
        "on 8 random inputs: ",
    ]
    lines += [", ".join(f"{m} {d:.2g}" for m, d in r["precision"].items()), ""]
    return lines


def _serving(r: dict[str, Any]) -> list[str]:
    lines = [
        "## Serving: items/s, p50 / p99 ms; closed loop at c clients, Poisson at r requests/s",
        "",
    ]
    for model, table in r["serving"].items():
        levels = list(dict.fromkeys(level for row in table.values() for level in row))
        lines += [
            f"### {model}",
            "",
            "| server | protocol | " + " | ".join(levels) + " |",
            "|---" * (len(levels) + 2) + "|",
        ]
        for label, row in table.items():
            cells = [_cell(row.get(level)) for level in levels]
            lines.append(f"| {label} | binary | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _cell(s: dict[str, float] | None) -> str:
    if s is None:
        return ""
    failed = f", {s['failed']:.0%} failed" if s["failed"] > 0.001 else ""
    return f"{_f(s['items_per_s'])}/s, {_f(s['p50_ms'], 2)} / {_f(s['p99_ms'], 1)}{failed}"


def _best_limit(r: dict[str, Any], model: str, backend: str, precision: str) -> float:
    return max(
        row["best"][1]
        for row in r["limit"]
        if (row["model"], row["backend"], row["precision"]) == (model, backend, precision)
    )


def _several_items(r: dict[str, Any]) -> list[str]:
    rows = r.get("several_items", {})
    if not rows:
        return []
    lines = [
        "## Requests of several items (not counted in the targets)",
        "",
        "The OpenVINO auto server at c=16 when each request carries several items: the cost of a "
        "request (HTTP, parsing, the event loop) is then shared by its items.",
        "",
        "| model | items per request | items/s | / limit (openvino auto) | p99 ms |",
        "|---|---|---|---|---|",
    ]
    for model, row in rows.items():
        limit = _best_limit(r, model, "openvino", "auto")
        lines.append(
            f"| {model} | {row['items_per_request']} | {row['items_per_s']:.0f} | "
            f"{row['items_per_s'] / limit:.2f} | {row['p99_ms']:.1f} |"
        )
    return [*lines, ""]


def _targets(r: dict[str, Any]) -> list[str]:
    rows = []
    serving = r["serving"]
    for model in ("resnet", "crnn"):
        if model in serving and OV in serving[model]:
            got = max(serving[model][OV][c]["items_per_s"] for c in serving[model][OV])
            limit = _best_limit(r, model, "openvino", "auto")
            rows.append(
                (
                    f"{model}: edgeserve (openvino auto) at saturation / limit (openvino auto)",
                    got / limit,
                    ">= 0.90",
                    got / limit >= 0.9,
                )
            )
    for model, table in serving.items():
        if TRITON not in table:
            continue
        ratios = {
            c: table[EDGE][c]["items_per_s"] / table[TRITON][c]["items_per_s"]
            for c in table[EDGE]
            if c.startswith("c=")
        }
        worst = min(ratios, key=lambda c: ratios[c])
        rows.append(
            (
                f"{model}: throughput edgeserve / Triton, worst level ({worst})",
                ratios[worst],
                ">= 1.00",
                ratios[worst] >= 1,
            )
        )
        p99 = table[EDGE]["c=16"]["p99_ms"] / table[TRITON]["c=16"]["p99_ms"]
        rows.append((f"{model}: p99 at c=16, edgeserve / Triton", p99, "<= 1.00", p99 <= 1))
    for setting, levels in r.get("overload", {}).items():
        ratio = levels["c=256"]["items_per_s"] / levels["c=16"]["items_per_s"]
        rows.append(
            (
                f"crnn, queue of 64, workers={setting}: good answers at 256 / 16 connections",
                ratio,
                ">= 0.80",
                ratio >= 0.8,
            )
        )
    if "mlp" in serving:
        mlp = serving["mlp"]
        ratio = mlp[EDGE]["c=64"]["items_per_s"] / mlp[FLOOR]["c=64"]["items_per_s"]
        rows.append(("mlp: throughput at c=64, edgeserve / floor", ratio, ">= 0.95", ratio >= 0.95))
        extra = mlp[EDGE]["c=1"]["p50_ms"] - mlp[FLOOR]["c=1"]["p50_ms"]
        rows.append(("mlp: p50 at c=1, edgeserve - floor (ms)", extra, "<= 0.10", extra <= 0.1))
    ready = statistics.median(r["coldstart"]["ready_s"][1:])
    rows.append(
        (
            f"cold start: `edgeserve serve {r['coldstart']['target']}` to ready (s, median)",
            ready,
            "<= 1.5",
            ready <= 1.5,
        )
    )
    for model, memory in r["memory"].items():
        for server, alone in ((EDGE, "backend alone (ort)"), (OV, "backend alone (openvino auto)")):
            extra = memory[server] - memory[alone]
            rows.append((f"{model}: RSS {server} - {alone} (MB)", extra, "<= 60", extra <= 60))
    lines = [
        "## Targets (ratios from this one run)",
        "",
        "| target | measured | goal | met |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {value:.2f} | {goal} | {'yes' if ok else '**no**'} |"
        for name, value, goal, ok in rows
    ]
    return [*lines, ""]


def _cpu(r: dict[str, Any]) -> list[str]:
    """Where the 2 cores go at saturation: CPU per answered item, server and load generator."""
    lines = [
        "## CPU per answered item at c=16 (µs, all threads; the cores are shared by both sides)",
        "",
        "| model | server | server CPU/item | load generator CPU/item |",
        "|---|---|---|---|",
    ]
    for model, table in r["serving"].items():
        for label, row in table.items():
            s = row.get("c=16")
            if s:
                lines.append(
                    f"| {model} | {label} | {_f(s['server_cpu_us'])} | {_f(s['client_cpu_us'])} |"
                )
        for limit in r["limit"]:
            if limit["model"] == model:
                size = limit["best"][0]
                cpu = limit["cpu_us"].get(size, limit["cpu_us"].get(str(size), float("nan")))
                lines.append(
                    f"| {model} | limit: {limit['backend']} {limit['precision']} b={size} "
                    f"| {_f(cpu)} | - |"
                )
    return [*lines, ""]


def _threading(r: dict[str, Any]) -> list[str]:
    if not r.get("threading"):
        return []
    labels = list(next(iter(r["threading"].values())))
    lines = ["## Instances x threads on 2 cores: edgeserve at c=16, items/s and p99 ms", ""]
    lines += ["| model | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for model, row in r["threading"].items():
        lines.append(
            f"| {model} | "
            + " | ".join(
                f"{_f(row[label]['items_per_s'])}/s, {_f(row[label]['p99_ms'], 1)}"
                for label in labels
            )
            + " |"
        )
    return [*lines, ""]


def _slo(r: dict[str, Any]) -> list[str]:
    if "slo" not in r:
        return []
    slo = r["slo"]
    labels = list(next(iter(slo["table"].values())))
    lines = [
        f"## SLO-aware batching: {slo['model']}, Poisson arrivals, "
        f"latency_slo_ms = {slo['slo_ms']:g}",
        "",
        f"Capacity (edgeserve ort, closed loop, saturation): {slo['capacity']:.0f} items/s. "
        "Cells: answered items/s, answered within the SLO/s, p99 ms of the answered, share "
        "refused (503 shed or queue full); **bold**: p99 within the SLO.",
        "",
        "| rate | " + " | ".join(labels) + " |",
        "|---" * (len(labels) + 1) + "|",
    ]
    for share, row in slo["table"].items():
        cells = []
        for label in labels:
            s = row[label]
            text = (
                f"{_f(s['items_per_s'])}/s, {_f(s['within_slo_per_s'])} in time, "
                f"p99 {_f(s['p99_ms'], 1)}, {s['failed']:.0%}"
            )
            cells.append(f"**{text}**" if s["p99_ms"] <= slo["slo_ms"] else text)
        lines.append(
            f"| {share} ({float(share.rstrip('%')) / 100 * slo['capacity']:.0f}/s) | "
            + " | ".join(cells)
            + " |"
        )
    return [*lines, ""]


def _simulation(r: dict[str, Any]) -> list[str]:
    sim = r["simulation"]
    heading = f"## SLO-aware batching, simulated: latency_slo_ms = {sim['slo_ms']:g}"
    labels = list(next(iter(sim["table"].values())))
    lines = [
        heading,
        "",
        "Without the noise of a shared machine: tests/slo_simulation.py drives the real planner",
        f"with a known cost (2 ms + 2.5 ms per row, capacity {sim['capacity']:.0f}/s) and Poisson",
        "arrivals over 20 simulated seconds. Cells: answered/s, answered within the SLO/s, p99 ms,",
        "share shed.",
        "",
        "| rate | " + " | ".join(labels) + " |",
        "|---" * (len(labels) + 1) + "|",
    ]
    for share, row in sim["table"].items():
        cells = []
        for label in labels:
            s = row[label]
            text = (
                f"{s['served_per_s']:.0f}/s, {s['goodput_per_s']:.0f} in time, "
                f"p99 {s['p99_ms']:.1f}, {s['shed']:.0%}"
            )
            cells.append(f"**{text}**" if s["p99_ms"] <= sim["slo_ms"] else text)
        lines.append(f"| {share} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _coldstart(r: dict[str, Any]) -> list[str]:
    c = r["coldstart"]
    phases = c["phases"]
    return [
        "## Cold start",
        "",
        f"`edgeserve serve {c['target']}` spawn to ready: first {c['ready_s'][0]:.2f} s "
        "(builds the bundle cache), "
        f"then {', '.join(f'{s:.2f}' for s in c['ready_s'][1:])} s.",
        f"In-process phases ({phases['backend']}): import {phases['import_s']:.2f} s, "
        f"open bundle {phases['open_s']:.2f} s, "
        f"model load {phases['load_s']:.2f} s, warm-up {phases['warmup_s']:.2f} s.",
        "",
    ]


def _memory(r: dict[str, Any]) -> list[str]:
    lines = [
        "## Memory (RSS MB, idle 5 s after the serving runs)",
        "",
        "Backend alone: a process holding only the backend, after one batch of every size "
        "1..32 (the shapes a server runs; each one leaves buffers in the backend), free heap "
        "memory then returned to the system as an idle server does (edgeserve/memory.py).",
        "",
        "| model | " + " | ".join(next(iter(r["memory"].values()))) + " |",
    ]
    lines.append("|---" * (len(next(iter(r["memory"].values()))) + 1) + "|")
    for model, memory in r["memory"].items():
        lines.append(f"| {model} | " + " | ".join(_f(v) for v in memory.values()) + " |")
    return [*lines, ""]
