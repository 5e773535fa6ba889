"""bench/report.py: a benchmark rewrites only its own region of a results page.

``make bench-scale`` used to overwrite bench/results/scale.md whole, dropping the
before/after sections written by hand below its table.
"""

from __future__ import annotations

from pathlib import Path

from bench.report import replace_region, write_scale_results


def test_a_region_is_replaced_and_the_text_around_it_kept(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- scale:begin -->\nold table\n<!-- scale:end -->\nafter\n")
    replace_region(str(page), "scale", "new table\n")
    expected = "before\n<!-- scale:begin -->\nnew table\n<!-- scale:end -->\nafter\n"
    assert page.read_text() == expected


def test_markers_are_created_first_in_a_page_without_them(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    replace_region(str(page), "scale", "table")
    assert page.read_text() == "<!-- scale:begin -->\ntable\n<!-- scale:end -->\n"
    written_by_hand = tmp_path / "hand.md"
    written_by_hand.write_text("## Notes by hand\n")
    replace_region(str(written_by_hand), "scale", "table")
    replace_region(str(written_by_hand), "scale", "table again")
    assert written_by_hand.read_text() == (
        "<!-- scale:begin -->\ntable again\n<!-- scale:end -->\n\n## Notes by hand\n"
    )


def test_another_region_of_the_page_is_left_alone(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    replace_region(str(page), "one", "1")
    replace_region(str(page), "two", "2")
    replace_region(str(page), "one", "uno")
    text = page.read_text()
    assert "<!-- one:begin -->\nuno\n<!-- one:end -->" in text
    assert "<!-- two:begin -->\n2\n<!-- two:end -->" in text
    assert "\n1\n" not in text


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
