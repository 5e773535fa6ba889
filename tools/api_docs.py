"""The public Python API's reference, from its docstrings: ``make api-docs``.

    python tools/api_docs.py [--output build/api]

Writes one HTML page per public name of ``dlm`` (what ``dlm.__all__`` lists), an
index linking them, and the same as plain text in ``dlm.txt``, with pydoc from the
standard library: nothing to install beyond dlm's own dependencies. The names are
found through ``dlm.__all__``, not by walking modules, so what is internal
(``dlm.client``, names with a leading underscore) stays out of the reference.
"""

from __future__ import annotations

import argparse
import html
import inspect
import pydoc
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def public_names() -> list[tuple[str, object]]:
    sys.path.insert(0, str(ROOT))
    import dlm

    return [(name, getattr(dlm, name)) for name in dlm.__all__ if name != "__version__"]


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body>\n{body}\n</body></html>\n"
    )


def write(output: Path) -> list[Path]:
    """Writes the reference under ``output``; returns the files written."""
    import dlm

    output.mkdir(parents=True, exist_ok=True)
    names = public_names()
    html_doc = pydoc.HTMLDoc()
    text_doc = pydoc.TextDoc()
    written: list[Path] = []
    rows = []
    text_parts = [f"dlm {dlm.__version__}: the public Python API\n\n{inspect.getdoc(dlm)}\n"]
    for name, value in names:
        page = output / f"dlm.{name}.html"
        body = html_doc.document(value, f"dlm.{name}")
        page.write_text(_page(f"dlm.{name}", body), encoding="utf-8")
        written.append(page)
        summary = (inspect.getdoc(value) or "").split("\n\n")[0].replace("\n", " ")
        rows.append(
            f"<tr><td><a href='{page.name}'><code>dlm.{html.escape(name)}</code></a></td>"
            f"<td>{html.escape(summary)}</td></tr>"
        )
        text_parts.append(pydoc.plain(text_doc.document(value, f"dlm.{name}")))
    intro = html.escape(inspect.getdoc(dlm) or "")
    index = output / "index.html"
    index.write_text(
        _page(
            "dlm: the public Python API",
            f"<h1>dlm {html.escape(dlm.__version__)}: the public Python API</h1>"
            f"<pre>{intro}</pre><p>Guide: docs/python.md</p>"
            f"<table>{''.join(rows)}</table>",
        ),
        encoding="utf-8",
    )
    text = output / "dlm.txt"
    text.write_text("\n\n".join(text_parts), encoding="utf-8")
    return [index, *written, text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--output", type=Path, default=ROOT / "build" / "api")
    args = parser.parse_args(argv)
    files = write(args.output)
    print(f"wrote {len(files)} files under {args.output} (open {files[0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
