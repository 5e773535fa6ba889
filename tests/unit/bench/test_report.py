"""bench/report.py: a benchmark rewrites only its own region of a results page.

Results pages collect before/after sections written by hand below the table a
benchmark prints; a rerun of the benchmark must replace its table and keep them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.report import region_markers, write_marked_region, write_scale_results
from bench.startup import RESULTS_MARKER, write_startup_page


def test_a_missing_page_gets_the_title_and_the_region(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    write_marked_region(str(page), "bench.x", "figures 1\n", title="X benchmark")
    begin, end = region_markers("bench.x")
    assert page.read_text() == f"# X benchmark\n\n{begin}\nfigures 1\n{end}\n"


def test_a_rerun_replaces_the_region_and_keeps_what_is_around_it(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    write_marked_region(str(page), "bench.x", "figures 1", title="X benchmark")
    page.write_text("intro by hand\n" + page.read_text() + "\n## Before/after\n\nkept\n")
    write_marked_region(str(page), "bench.x", "figures 2", title="X benchmark")
    text = page.read_text()
    assert "figures 1" not in text
    assert "figures 2" in text
    assert text.startswith("intro by hand\n# X benchmark\n")
    assert text.endswith("\n## Before/after\n\nkept\n")


def test_other_markers_regions_are_left_alone(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    write_marked_region(str(page), "bench.a", "a 1", title="T")
    with page.open("a") as f:
        b_begin, b_end = region_markers("bench.b")
        f.write(f"\n{b_begin}\nb 1\n{b_end}\n")
    write_marked_region(str(page), "bench.a", "a 2", title="T")
    write_marked_region(str(page), "bench.b", "b 2", title="T")
    text = page.read_text()
    assert "a 2" in text and "b 2" in text
    assert "a 1" not in text and "b 1" not in text


def test_a_page_from_before_the_markers_keeps_its_text_below_the_region(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    page.write_text("# Old\n\nold table\n\n## Notes by hand\n")
    write_marked_region(str(page), "bench.x", "new table", title="ignored")
    begin, end = region_markers("bench.x")
    assert page.read_text() == (
        f"# Old\n\n{begin}\nnew table\n{end}\n\nold table\n\n## Notes by hand\n"
    )


def test_a_begin_without_an_end_is_refused_not_guessed(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    begin, _ = region_markers("bench.x")
    page.write_text(f"# T\n\n{begin}\nold\n\n## by hand\n")
    with pytest.raises(ValueError, match="fix the page by hand"):
        write_marked_region(str(page), "bench.x", "new", title="T")
    assert "## by hand" in page.read_text()


def test_the_startup_benchmark_keeps_the_sections_below_its_table(tmp_path: Path) -> None:
    page = tmp_path / "startup.md"
    write_startup_page(str(page), "run 1\n")
    page.write_text(page.read_text() + "\n## Issue 29, item 3 (by hand)\n\nkept\n")
    write_startup_page(str(page), "run 2\n")
    text = page.read_text()
    assert "run 1" not in text
    assert "run 2" in text
    assert text.endswith("## Issue 29, item 3 (by hand)\n\nkept\n")
    begin, end = region_markers(RESULTS_MARKER)
    assert text.index(begin) < text.index("run 2") < text.index(end)


def test_the_committed_startup_page_has_its_markers() -> None:
    page = Path(__file__).resolve().parents[3] / "bench" / "results" / "startup.md"
    begin, end = region_markers(RESULTS_MARKER)
    text = page.read_text()
    assert 0 <= text.index(begin) < text.index(end)


def test_a_runs_cpu_time_counts_the_descendants_it_waited_for(tmp_path: Path) -> None:
    # dlm exec's CMD is the guard's child, and the guard is dlm's: the start-up figures
    # count their CPU too. The grandchild here burns CPU_S of CPU; nothing is timed.
    import os
    import sys

    from bench.startup import time_once

    cpu_s = 0.3
    burn = f"import time\nwhile time.process_time() < {cpu_s}: pass\n"
    parent = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {burn!r}])\n"
    wall_ms, cpu_ms, code = time_once(
        [sys.executable, "-c", parent], dict(os.environ), str(tmp_path)
    )
    assert code == 0
    assert cpu_ms >= cpu_s * 1000 - 50  # clock ticks of 10 ms, user and system apart
    assert wall_ms > 0


def test_the_scale_page_keeps_the_sections_written_below_its_table(tmp_path: Path) -> None:
    locks = None
    leases = None
    for run in ("first run", "second run"):
        write_scale_results(
            str(tmp_path),
            "scale",
            heading=run,
            table="| figure |\n|---|",
            notes=[],
            everything={},
            leases=leases,
            locks=locks,
        )
        if run == "first run":
            page = tmp_path / "scale.md"
            page.write_text(page.read_text() + "\n## Issue 29, item 2: before/after\n\nkept\n")
    text = (tmp_path / "scale.md").read_text()
    assert "second run" in text and "first run" not in text
    assert text.endswith("## Issue 29, item 2: before/after\n\nkept\n")
    assert text.count("# Scale benchmark") == 1
