"""Every command's output pinned bit for bit (torchtitan's rule before a restructuring).

Each case runs `rpeg ...` in-process and compares exit code, stdout, stderr and the files it
writes with `tests/golden/<case>.txt`. Only what cannot repeat is masked: the search's own wall
time and the temporary output folder. Regenerate after an intended change of output with
`RPEG_GOLDEN_WRITE=1 .venv/bin/python -m pytest tests/test_golden_cli.py` and read the diff.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re

import pytest

from rpeg.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
DATA = ROOT / "tests" / "data"

CASES = {
    "algorithms": ["algorithms"],
    "models": ["models"],
    "passes": ["passes"],
    "hardware": ["hardware"],
    "show-grpo": ["show", "grpo", "--model", "qwen2.5-7b", "--prompts", "32", "--response-max", "4096",
                  "--async", "1", "--out", "{out}"],
    "show-job": ["show", "examples/grpo-qwen3-8b.yaml", "--stream", "2", "--out", "{out}"],
    "error-share": ["show", "examples/ppo-llama-8b.yaml", "--share", "--out", "{out}"],
    "analyze-job": ["analyze", "examples/grpo-qwen3-8b.yaml", "--steps", "4"],
    "analyze-json": ["analyze", "ppo", "--model", "llama-3.1-8b", "--kl-coef", "0.05", "--stream", "4", "--json"],
    "predict-ppo": ["predict", "examples/ppo-llama-8b.yaml"],
    "predict-h20": ["predict", "examples/grpo-qwen2.5-7b-h20-64.yaml"],
    "predict-json": ["predict", "examples/grpo-qwen3-8b.yaml", "--cluster", "dgx-b200", "--gpus", "16", "--json"],
    "predict-oom": ["predict", str(DATA / "oom-llama70b-8gpu.yaml")],
    "predict-oom-json": ["predict", str(DATA / "oom-llama70b-8gpu.yaml"), "--json"],
    "predict-name": ["predict", "grpo", "--model", "qwen3-1.7b", "--gpus", "2"],
    "validate": ["validate", "nemo-rl-v0.5-extra"],
    "validate-json": ["validate", "nemo-rl-v0.5-extra", "--json"],
    "plan-ppo": ["plan", "examples/ppo-llama-8b.yaml", "--out", "{out}"],
    "plan-h20-json": ["plan", "examples/grpo-qwen2.5-7b-h20-64.yaml", "--objective", "cost", "--json",
                      "--out", "{out}"],
    "plan-none": ["plan", "grpo", "--model", "llama-3.1-405b", "--gpus", "2", "--out", "{out}"],
    "error-model": ["predict", "grpo", "--model", "nope"],
    "error-gpus": ["plan", "grpo", "--model", "qwen3-1.7b", "--gpus", "0"],
    "error-file": ["validate", "no/such/file.yaml"],
}

SEARCH_SECONDS = (re.compile(r"in \d+\.\d s\n"), "in <seconds> s\n")
PNG = b"\x89PNG"
JSON_SECONDS = (re.compile(r'"seconds": [0-9.e+-]+'), '"seconds": <seconds>')


def _run(argv: list[str], out: pathlib.Path) -> str:
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = [a.replace("{out}", str(out)) for a in argv]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(argv)
    finally:
        os.chdir(cwd)
    text = f"exit {code}\n--- stdout\n{stdout.getvalue()}--- stderr\n{stderr.getvalue()}"
    if out.is_dir():
        for f in sorted(out.iterdir()):
            if f.suffix in (".dot", ".json"):
                text += f"--- file {f.name}\n{f.read_text(encoding='utf-8')}\n"
            else:
                kind = "png" if f.read_bytes()[:4] == PNG else "other"
                text += f"--- file {f.name} ({kind})\n"
    text = text.replace(str(out), "<out>")
    for pattern, replacement in (SEARCH_SECONDS, JSON_SECONDS):
        text = pattern.sub(replacement, text)
    return text


@pytest.mark.parametrize("case", sorted(CASES))
def test_command_output_unchanged(case, tmp_path):
    got = _run(CASES[case], tmp_path / "out")
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("RPEG_GOLDEN_WRITE"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got, encoding="utf-8")
    assert path.exists(), f"no golden output for {case}: run with RPEG_GOLDEN_WRITE=1 once"
    want = path.read_text(encoding="utf-8")
    assert got == want, f"`rpeg {' '.join(CASES[case])}` changed its output (see {path})"
