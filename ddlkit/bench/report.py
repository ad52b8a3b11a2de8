"""A strategy benchmark's results as a table (HTML or text) and a plot, from bench.json."""

from __future__ import annotations

import html
from pathlib import Path

from ddlkit._tables import html_table, text_table

HEADERS = (
    "case",
    "examples/s (median)",
    "min-max",
    "ms/step",
    "speed-up vs x1",
    "efficiency",
    "vs single-x1",
    "comm share",
    "s to target",
    "others' CPU",
    "test acc",
    "note",
)


def _fmt(value: float | None, spec: str) -> str | None:
    return None if value is None else format(value, spec)


def _comm_cell(c: dict) -> str | None:
    """ "12%", "30% (est.)" or "n/m" (not measured: the notes say why)."""
    if not c["runs"]:
        return None
    comm = c.get("comm") or {}
    if comm.get("share") is None:
        return "n/m"
    estimate = comm.get("how", "").startswith("estimate")
    return f"{comm['share']:.0%}" + (" (est.)" if estimate else "")


def _target_cell(c: dict) -> str | None:
    """Median seconds to the target accuracy with how many runs reached it, or why not."""
    target = c.get("seconds_to_target")
    if target:
        return f"{target['median']:.1f} ({c.get('target_reached')})"
    if not c["runs"]:
        return None
    return "n/m" if not c.get("eval_every") else f"not reached ({c.get('target_reached')})"


def rows(doc: dict) -> list[tuple]:
    """One row per case of a bench.json document (pure)."""
    out = []
    for c in doc["cases"]:
        rate, step, acc = c["examples_per_sec"], c["step_time"], c["test_accuracy"]
        note = c["skipped"] and f"skipped: {c['skipped']}" or c["error"] and "FAILED: " + c["error"]
        foreign = c.get("foreign_cpu")
        out.append(
            (
                c["name"],
                _fmt(rate and rate["median"], ".0f"),
                rate and f"{rate['min']:.0f}-{rate['max']:.0f} (n={rate['n']})",
                _fmt(step and step["median"] * 1000, ".1f"),
                _fmt(c["speedup"], ".2f"),
                _fmt(c["efficiency"], ".0%"),
                _fmt(c["vs_single"], ".2f"),
                _comm_cell(c),
                _target_cell(c),
                _fmt(foreign and foreign["median"], ".0%"),
                _fmt(acc and acc["median"], ".3f"),
                note or None,
            )
        )
    return out


def _caption(doc: dict) -> str:
    m = doc["machine"]
    load = m.get("load_start")
    return (
        f"bench {doc['bench_id']}: {len(m['cores'])} cores, {m['cores_per_worker']} per worker, "
        f"{doc['wall_seconds']:.0f} s"
        + (f", load {load[0]:.1f} at start" if load else "")
        + (f", target accuracy {doc['target_accuracy']}" if doc.get("target_accuracy") else "")
    )


def notes(doc: dict) -> list[str]:
    """The ways the communication share was found, and why cases missed the target (pure)."""
    out = {}
    for c in doc["cases"]:
        how = (c.get("comm") or {}).get("how")
        if how and c["runs"]:
            out.setdefault(f"comm share: {how}", None)
    for c in doc["cases"]:
        if c.get("target_note") and c["runs"]:
            out.setdefault(f"{c['name']}: target accuracy {c['target_note']}", None)
    out.setdefault(
        "others' CPU: share of the case's cores used by other processes during its runs "
        "(median); the cases are only comparable where it is near 0",
        None,
    )
    return list(out)


def overhead_line(doc: dict) -> str:
    """One sentence on the kit's overhead, or why it is missing (pure)."""
    o = doc.get("overhead")
    if o:
        ratios = ", ".join(f"{r:.3f}" for r in o["ratios"])
        return (
            f"kit overhead: examples/s through ddlkit (live metrics) / by hand = "
            f"{o['ratio_median']:.3f} median of {len(o['ratios'])} alternating pair(s) "
            f"({ratios}; range {min(o['ratios']):.3f}-{max(o['ratios']):.3f}); goal >= 0.97"
        )
    if doc.get("overhead_error"):
        return f"kit overhead: FAILED: {doc['overhead_error']}"
    return "kit overhead: not measured (--overhead-pairs 0)"


def html_report(doc: dict) -> str:
    table = html_table(HEADERS, rows(doc), _caption(doc))
    lines = [overhead_line(doc), *notes(doc)]
    return table + "".join(f"<p>{html.escape(line)}</p>" for line in lines)


def text_report(doc: dict) -> str:
    lines = [overhead_line(doc), *notes(doc)]
    return text_table(HEADERS, rows(doc), _caption(doc), rule=True) + "\n" + "\n".join(lines)


def save_plot(doc: dict, path: str | Path) -> Path:
    """Bar charts of throughput (median, min-max whiskers) and scaling efficiency."""
    from matplotlib.figure import Figure  # no pyplot: leaves a notebook's backend alone

    done = [c for c in doc["cases"] if c["examples_per_sec"]]
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_rate, ax_eff = fig.subplots(1, 2)
    names = [c["name"] for c in done]
    med = [c["examples_per_sec"]["median"] for c in done]
    low = [m - c["examples_per_sec"]["min"] for m, c in zip(med, done, strict=True)]
    high = [c["examples_per_sec"]["max"] - m for m, c in zip(med, done, strict=True)]
    ax_rate.bar(names, med, yerr=[low, high], capsize=3, color="tab:blue")
    ax_rate.set_ylabel("examples / s (all workers)")
    ax_rate.set_title("throughput: median of repeats, min-max")
    ax_rate.tick_params(axis="x", rotation=45)
    scaled = [c for c in done if c["efficiency"] is not None and c["workers"] > 1]
    ax_eff.bar([c["name"] for c in scaled], [c["efficiency"] for c in scaled], color="tab:green")
    ax_eff.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="linear scaling")
    ax_eff.axhline(0.9, color="tab:red", linestyle=":", linewidth=1, label="goal 0.9 (1.8x on 2)")
    ax_eff.set_ylabel("speed-up / workers")
    ax_eff.set_title("scaling efficiency vs the same strategy x1")
    ax_eff.tick_params(axis="x", rotation=45)
    ax_eff.legend(loc="upper right", fontsize="small")
    fig.suptitle(_caption(doc))
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path
