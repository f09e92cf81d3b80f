"""docs/plan.md's headline tables and the README's summary are what scripts/headline_tables.py
renders from docs/headline.json (benchmarks/headline.py's output), so the figures cannot drift."""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import headline_tables  # noqa: E402


def _block(path: pathlib.Path, mark: str) -> str:
    start, end = headline_tables.MARKS[mark]
    text = path.read_text(encoding="utf-8")
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n")


def test_the_docs_show_the_benchmarks_figures():
    data = json.loads((ROOT / "docs" / "headline.json").read_text(encoding="utf-8"))
    assert _block(ROOT / "docs" / "plan.md", "headline") == headline_tables.tables(data)
    assert _block(ROOT / "README.md", "headline-summary") == headline_tables.summary(data)


def test_write_replaces_only_the_marked_block(tmp_path):
    data = json.loads((ROOT / "docs" / "headline.json").read_text(encoding="utf-8"))
    doc = tmp_path / "d.md"
    doc.write_text("before\n<!-- headline-summary:start -->\nold\n<!-- headline-summary:end -->\nafter\n")
    headline_tables.write(headline_tables.summary(data), str(doc), "headline-summary")
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("\nafter\n") and "old" not in text
    assert headline_tables.summary(data) in text
