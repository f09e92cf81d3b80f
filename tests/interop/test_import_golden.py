"""Every importer's and exporter's outcome on the import corpus, pinned byte for byte (torchtitan's
rule: a refactor that does not mean to change behaviour changes no output).

For each file of tests/data/peers/{verl,openrlhf,areal} (SOURCES.md skipped) the golden file
tests/interop/golden/import-corpus.json holds what `system(name).read(text, filename)` gives: the
view as an RPEG job file (`job_data(view)`), the mode, the unmapped and assumed lines; or the
refusal's one-line message. For every file that imports it also holds what `system(name).write(view)`
gives (the peer config RPEG writes: its text, what it left out, its file name and the view it states)
or the refusal. Nothing here depends on predicted seconds, only on views and texts.

After an intended change of what the importers or exporters say, regenerate and read the diff:
`RPEG_GOLDEN_WRITE=1 .venv/bin/python -m pytest tests/interop/test_import_golden.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rpeg.errors import RpegError
from rpeg.interop import SYSTEMS, system
from rpeg.interop.common import job_data

DATA = Path(__file__).parent.parent / "data" / "peers"
GOLDEN = Path(__file__).parent / "golden" / "import-corpus.json"
# files whose model path names no model RPEG knows, read once more as a user would with --model
# (the entry `system/file --model NAME`), so the rest of their config is pinned too
MODELS = {("verl", "run_deepseek671b_math_megatron_80gb.sh"): "deepseek-v3",
          ("verl", "qwen2-70b_grpo_32_h20_fsdp_vllm.sh"): "qwen2.5-72B"}


def _lines(text: str) -> list[str]:
    return text.split("\n")  # one JSON string per line (readable diffs); "\n".join gives the text back exactly


def outcome(name: str, filename: str, model: str | None = None) -> dict[str, Any]:
    """What the importer and then the exporter of `name` make of one corpus file."""
    text = (DATA / name / filename).read_text(encoding="utf-8")
    adapter = system(name)
    try:
        imported = adapter.read(text, filename, model=model)
    except RpegError as e:
        return {"refused": str(e)}
    out: dict[str, Any] = {"system": imported.system, "mode": imported.mode, "view": job_data(imported.view),
                           "unmapped": list(imported.unmapped), "assumed": list(imported.assumed),
                           "source": imported.source}
    try:
        exported = adapter.write(imported.view)
    except RpegError as e:
        out["export"] = {"refused": str(e)}
        return out
    out["export"] = {"system": exported.system, "filename": exported.filename, "left_out": list(exported.left_out),
                     "view": job_data(exported.view), "text": _lines(exported.text)}
    return out


def corpus() -> list[tuple[str, str]]:
    return [(s, p.name) for s in SYSTEMS for p in sorted((DATA / s).iterdir()) if p.name != "SOURCES.md"]


def render() -> str:
    """The golden file's text: one entry per corpus file, keys sorted, non-ASCII kept as is."""
    data = {f"{s}/{f}": outcome(s, f) for s, f in corpus()}
    data.update({f"{s}/{f} --model {m}": outcome(s, f, m) for (s, f), m in MODELS.items()})
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def test_the_import_corpus_reads_and_writes_as_pinned():
    got = render()
    if os.environ.get("RPEG_GOLDEN_WRITE"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(got, encoding="utf-8")
    want = GOLDEN.read_text(encoding="utf-8")
    if got != want:  # name the files whose outcome changed before the byte comparison fails
        g, w = json.loads(got), json.loads(want)
        changed = sorted(k for k in g.keys() | w.keys() if g.get(k) != w.get(k))
        assert not changed, f"outcomes changed for {changed} (regenerate only for an intended change: the docstring)"
    assert got == want


def test_the_golden_covers_every_file_and_both_outcomes():
    pinned = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert set(pinned) == {f"{s}/{f}" for s, f in corpus()} | {f"{s}/{f} --model {m}" for (s, f), m in MODELS.items()}
    assert all("refused" not in pinned[f"{s}/{f} --model {m}"] for (s, f), m in MODELS.items())
    imported = [v for v in pinned.values() if "refused" not in v]
    assert len(imported) >= 40 and len(pinned) - len(imported) >= 5
    assert all(v["view"]["passes"] for v in imported)
    assert sum("text" in v["export"] for v in imported) >= 30
