"""scripts/import_corpus.py: one line per file, the counts, and the figures docs/interop.md quotes."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("import_corpus", ROOT / "scripts" / "import_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_counts_are_those_the_docs_quote(capsys):
    assert _script().main(["--json"]) == 0  # nothing crashed
    out = json.loads(capsys.readouterr().out)
    c = out["counts"]
    assert c["total"] == len(out["files"]) == c["imported"] + c["refused"] and c["crashed"] == 0
    doc = " ".join((ROOT / "docs" / "interop.md").read_text().split())
    m = re.search(r"Measured on (\d+) of the peers' own configs .*? now (\d+) import, (\d+) are refused, none crashes",
                  doc)
    assert m and tuple(map(int, m.groups())) == (c["total"], c["imported"], c["refused"])


def test_each_file_gets_one_line_and_the_exit_status_follows_crashes(tmp_path, capsys):
    folder = tmp_path / "verl"
    folder.mkdir()
    (folder / "job.yaml").write_text("actor_rollout_ref: {model: {path: Qwen/Qwen3-8B}}\ndata: [1, 2]\n")
    (folder / "job.sh").write_text("python3 -m verl.trainer.main_ppo data.train_batch_size=abc\n")
    rc = _script().main([str(folder)])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("verl/")]
    assert len(lines) == 2 and "verl/job.sh: refused: " in out and "2 files:" in out
    crashed = any(": crashed: " in line for line in lines)
    assert rc == (1 if crashed else 0)
