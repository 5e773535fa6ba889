"""Benchmark results as files a reader can open: a Markdown page, a PNG chart, the raw JSON.

``make bench`` and ``make bench-scale`` write them under bench/results/, and
the README links the latest. The chart needs matplotlib, a bench-only
dependency (the ``bench`` extra in pyproject.toml, installed by the bench make
targets only); without it the Markdown and JSON are still written and the
page says why there is no chart.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def region_markers(marker: str) -> tuple[str, str]:
    """The two comment lines that bound a benchmark's own region of a results page."""
    return f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"


def write_marked_region(path: str, marker: str, body: str, *, title: str | None) -> None:
    """Puts ``body`` between MARKER's begin/end comments in the page at ``path``, keeping
    everything else in it (notes and before/after sections written by hand below a table).

    A missing page is created as ``# title`` and the region (the region alone when
    ``title`` is None: the body brings its own heading). A page without the markers
    (written before they existed) gets the region right after its first line when that is
    a ``# `` heading, else at the top; its old text stays below for a person to prune.
    A page with a begin marker but no end marker is refused (ValueError) rather than
    guessed at: whatever follows the begin could be hand-written.
    """
    begin, end = region_markers(marker)
    text = body.rstrip("\n")
    region = f"{begin}\n{text}\n{end}"
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        _write_text(path, f"{region}\n" if title is None else f"# {title}\n\n{region}\n")
        return
    start = old.find(begin)
    if start >= 0:
        stop = old.find(end, start + len(begin))
        if stop < 0:
            raise ValueError(f"{path}: {begin} has no {end} after it; fix the page by hand")
        new = old[:start] + region + old[stop + len(end) :]
    elif old.startswith("# "):
        first, _, rest = old.partition("\n")
        rest = rest.lstrip("\n")
        new = f"{first}\n\n{region}\n\n{rest}"
    else:
        new = f"{region}\n\n{old}"
    _write_text(path, new)


def markdown_page(
    title: str, heading: str, sections: Sequence[tuple[str, str]], notes: Sequence[str], png: str
) -> str:
    parts = [f"# {title}", "", heading, ""]
    if png:
        parts += [f"![{title}]({png})", ""]
    for name, body in sections:
        if body:
            parts += [f"## {name}", "", body, ""]
    if notes:
        parts += ["## Notes", "", *(f"- {note}" for note in notes), ""]
    return "\n".join(parts)


def write_lock_results(
    directory: str,
    name: str,
    *,
    heading: str,
    sections: Sequence[tuple[str, str]],
    notes: Sequence[str],
    runs: Sequence[Any],
    everything: dict[str, Any],
) -> list[str]:
    """Writes NAME.md, NAME.json and (with matplotlib) NAME.png; returns the paths written."""
    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, name)
    written = []
    with open(base + ".json", "w") as f:
        json.dump(everything, f, indent=2)
    written.append(base + ".json")
    png = ""
    problem = lock_chart(runs, base + ".png", heading)
    if problem is None:
        png = name + ".png"
        written.append(base + ".png")
    else:
        notes = [*notes, f"no chart: {problem}"]
    _write_text(base + ".md", markdown_page("Lock benchmark", heading, sections, notes, png))
    written.insert(0, base + ".md")
    return written


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def lock_chart(runs: Sequence[Any], path: str, heading: str) -> str | None:
    """dlm beside etcd per cell: pairs/s, pair p50 and server CPU per pair.

    Returns None when written, else why not.
    """
    try:
        plt = _pyplot()
    except ImportError:
        return "matplotlib is not installed (make bench installs it: pip install -e '.[bench]')"
    labels: list[str] = []
    for run in runs:
        for cell in run.cells:
            if cell.label not in labels:
                labels.append(cell.label)
    figures = (
        ("pairs/s (higher is better)", lambda c: c.pairs_per_s),
        ("pair p50, ms (lower is better)", lambda c: c.pair.p50_ms),
        ("server CPU per pair, us (lower is better)", lambda c: c.server_cpu_per_pair_us),
    )
    fig, axes = plt.subplots(1, len(figures), figsize=(15, 4.8))
    width = 0.8 / max(1, len(runs))
    colours = {"dlm": "#2a6fdb", "etcd": "#9a9a9a"}
    for ax, (title, pick) in zip(axes, figures, strict=True):
        for k, run in enumerate(runs):
            values = []
            for label in labels:
                best = max(
                    (c for c in run.cells if c.label == label),
                    key=lambda c: c.pairs_per_s,
                    default=None,
                )
                value = pick(best) if best is not None else math.nan
                values.append(0.0 if math.isnan(value) else value)
            xs = [i + (k - (len(runs) - 1) / 2) * width for i in range(len(labels))]
            ax.bar(xs, values, width, label=run.system, color=colours.get(run.system))
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle(_wrap(heading), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def bar_chart(
    path: str, title: str, groups: Sequence[tuple[str, Sequence[tuple[str, float]]]]
) -> str | None:
    """One panel per group of (label, value) bars; returns None when written, else why not."""
    try:
        plt = _pyplot()
    except ImportError:
        return "matplotlib is not installed (make bench-scale installs it)"
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4.2), squeeze=False)
    for ax, (name, bars) in zip(axes[0], groups, strict=True):
        ax.bar([b[0] for b in bars], [0.0 if math.isnan(b[1]) else b[1] for b in bars])
        ax.set_title(name, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(_wrap(title), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _wrap(text: str, width: int = 150) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


def write_scale_results(
    directory: str,
    name: str,
    *,
    heading: str,
    table: str,
    notes: Sequence[str],
    everything: dict[str, Any],
    leases: Any,
    locks: Any,
) -> list[str]:
    """Writes NAME.md, NAME.json and (with matplotlib) NAME.png for bench/scale.py."""
    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, name)
    with open(base + ".json", "w") as f:
        json.dump(everything, f, indent=2)
    groups: list[tuple[str, Sequence[tuple[str, float]]]] = []
    if leases is not None:
        alone, busy = leases.keepalive_alone, leases.keepalive_with_acquirers
        groups.append(
            (
                "keep-alive latency, ms",
                [
                    ("p50 alone", alone.get("p50_ms", math.nan)),
                    ("p99 alone", alone.get("p99_ms", math.nan)),
                    ("p50 + acquirers", busy.get("p50_ms", math.nan)),
                    ("p99 + acquirers", busy.get("p99_ms", math.nan)),
                ],
            )
        )
        groups.append(
            (
                "16 acquirers: pair latency, ms",
                [
                    ("p50 no leases", leases.baseline.get("pair_p50_ms", math.nan)),
                    ("p50 with leases", leases.with_leases.get("pair_p50_ms", math.nan)),
                    ("p99 no leases", leases.baseline.get("pair_p99_ms", math.nan)),
                    ("p99 with leases", leases.with_leases.get("pair_p99_ms", math.nan)),
                ],
            )
        )
    if locks is not None:

        def seconds(value: float | None) -> float:
            return math.nan if value is None else value

        groups.append(
            (
                f"{locks.locks:,} locks: seconds",
                [
                    ("restart (replay)", seconds(locks.replay_restart_s)),
                    ("restart (snapshot)", seconds(locks.snapshot_restart_s)),
                    ("new member catch-up", seconds(locks.join_catch_up_s)),
                    ("snapshot write", locks.snapshot_write_ms / 1e3),
                    ("leader stall", locks.leader_stall_ms / 1e3),
                    ("dlm locks", locks.dlm_locks_s),
                    ("dlm status", locks.dlm_status_s),
                ],
            )
        )
    written = [base + ".md", base + ".json"]
    png = ""
    problem = bar_chart(base + ".png", heading, groups) if groups else "nothing measured"
    if problem is None:
        png = name + ".png"
        written.append(base + ".png")
    else:
        notes = [*notes, f"no chart: {problem}"]
    page = markdown_page("Scale benchmark", heading, [("Figures", table)], notes, png)
    # Only the run's own region: the before/after sections written below it stay.
    write_marked_region(base + ".md", name, page, title=None)
    return written
