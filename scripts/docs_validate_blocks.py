"""Re-run every `$ rpeg validate FILE` block of a Markdown file and write its output in, so the
tables in the docs are the model's current figures (a block whose first line is a `# ...` comment
is a record of an earlier state and is left alone), and rewrite the README's summary of the
validation (between `<!-- validate-summary:start -->` and `<!-- validate-summary:end -->`) from the
shipped validation files.

    .venv/bin/python scripts/docs_validate_blocks.py docs/perf.md README.md [--check]

FILE is a path from the repository root or the name of a shipped file (`rpeg validate published`).
--check exits 1 if a block or the summary differs (tests/test_docs_perf.py runs it that way).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```\n\$ rpeg validate (\S+)\n(.*?)```", re.S)
SUMMARY = re.compile(r"(<!-- validate-summary:start -->\n)(.*?)(<!-- validate-summary:end -->)", re.S)


def output(path: str) -> str:
    from rpeg.cli import main

    buf = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(buf):
            main(["validate", path])
    finally:
        os.chdir(cwd)
    return buf.getvalue().strip("\n") + "\n"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _moe_ids(path: str, kind: str = "rl") -> set[str]:
    """The ids of a validation file's `kind` entries whose model is a mixture of experts."""
    from rpeg.graph.serde import read_yaml_file
    from rpeg.perf.validation import _model, _models

    data = read_yaml_file(path)
    models = _models(data.get("models"), path)
    return {e["id"] for e in data.get(kind) or [] if _model(e["model"], models).experts}


def _fitted() -> str:
    """The fitted weight-sync constants' in-sample and leave-one-out errors (rpeg/data/fitted.yaml)."""
    import yaml

    from rpeg.perf.fitted import FITTED_PATH

    groups = (yaml.safe_load(FITTED_PATH.read_text()) or {}).get("groups") or {}
    rows = [r for g in groups.values() for r in g["rows"].values()]
    if not rows:
        return ""
    ins = sum(abs(r["in_sample"] / r["measured"] - 1) for r in rows) / len(rows)
    loo = sum(abs(r["loo"] / r["measured"] - 1) for r in rows) / len(rows)
    return (f" (the weight-sync constants fitted on these and the v0.3 refit stages by `scripts/fit_factors.py`, "
            f"over the {len(rows)} rows of their {len(groups)} groups: in-sample {_pct(ins)}, leave-one-out "
            f"{_pct(loo)}; `rpeg validate --all --loo`)")


def summary() -> str:
    """The README's paragraph on the validation, every figure computed from the shipped files."""
    from rpeg.perf.validation import bundled, stage_mapes, validate_file
    from rpeg.search.ratios import ratios_file, within

    files = {name: str(path) for name, path in bundled().items()}
    pub = validate_file(files["published"])
    parts = []
    for kind, label in (("training", "training"), ("rl", "RL")):
        rows = [r for r in pub if r.kind == kind and r.fits]
        errs = [abs(r.error) for r in rows]
        under = sum(r.error < 0 for r in rows)
        parts.append(f"{_pct(sum(errs) / len(errs))} on the {len(rows)} {label} entries (worst {_pct(max(errs))}, "
                     f"{under} of {len(rows)} under-predicted)")
    extra = [r for r in validate_file(files["nemo-rl-v0.5-extra"]) if r.fits]
    extra_err = sum(abs(r.error) for r in extra) / len(extra)
    extra_under = sum(r.error < 0 for r in extra)
    moe = _moe_ids(files["nemo-rl-v0.5-extra"])
    by_kind = {k: [abs(r.error) for r in extra if (r.id in moe) == (k == "moe")] for k in ("moe", "dense")}
    v03 = validate_file(files["nemo-rl-v0.3-stages"])
    steps = sum(abs(r.error) for r in v03 if r.fits) / sum(r.fits for r in v03)
    st = stage_mapes(v03)
    ratios = ratios_file(files["peer-ratios"])
    v06 = [r for r in validate_file(files["nemo-rl-v0.6"]) if r.fits]
    v06_err = {k: [abs(r.error) for r in v06 if r.kind == k] for k in ("rl", "refit")}
    bridge = validate_file(files["megatron-bridge"]) + validate_file(files["megatron-lm-moe-recipes"])
    fit = [r for r in bridge if r.fits]
    moe_train = _moe_ids(files["megatron-bridge"], "training") | _moe_ids(files["megatron-lm-moe-recipes"], "training")
    b_moe = [abs(r.error) for r in fit if r.id in moe_train]
    b_dense = [abs(r.error) for r in fit if r.id not in moe_train]
    return (
        f"`rpeg validate published` (Megatron-LM training iterations from Korthikanti et al. 2022, NeMo-RL v0.5 "
        f"GRPO steps), with one global set of efficiency factors: mean absolute error {parts[0]} and {parts[1]}. "
        f"On the {len(extra)} held-out NeMo-RL rows (`rpeg validate nemo-rl-v0.5-extra`) it is {_pct(extra_err)}, "
        f"{extra_under} of {len(extra)} under-predicted ({_pct(sum(by_kind['moe']) / len(by_kind['moe']))} on the "
        f"{len(by_kind['moe'])} mixture-of-experts rows, {_pct(sum(by_kind['dense']) / len(by_kind['dense']))} on the "
        f"{len(by_kind['dense'])} dense ones). On the {len(v03)} "
        f"NeMo-RL v0.3 steps with a published split per stage (`rpeg validate nemo-rl-v0.3-stages`) the step "
        f"error is {_pct(steps)} and the stage error {_pct(st['all'])} (generation {_pct(st['generation'])}, "
        f"logprobs {_pct(st['logprobs'])}, training {_pct(st['training'])}, refit {_pct(st['refit'])}). On the "
        f"{len(v06_err['rl'])} NeMo-RL v0.6 steps (`rpeg validate nemo-rl-v0.6`) the step error is "
        f"{_pct(sum(v06_err['rl']) / len(v06_err['rl']))}, and on that file's {len(v06_err['refit'])} published "
        f"weight syncs (NeMo-RL and verl) {_pct(sum(v06_err['refit']) / len(v06_err['refit']))}{_fitted()}. Of the "
        f"{len(ratios)} published comparisons between systems (`rpeg validate peer-ratios`: HybridFlow, ReaL, "
        f"verl fully_async), {len(within(ratios))} are predicted within 0.75-1.33x of the published ratio. "
        f"On the {len(bridge)} Megatron-Core training iterations NVIDIA published for Megatron-Bridge and "
        f"Megatron-LM's MoE recipes (`rpeg validate megatron-bridge`, `megatron-lm-moe-recipes`: dense and MoE, "
        f"H100, B200 and GB200, RL-sized batches and 32K sequences) it is "
        f"{_pct(sum(abs(r.error) for r in fit) / len(fit))} over the {len(fit)} predicted to fit "
        f"({_pct(sum(b_moe) / len(b_moe))} on the {len(b_moe)} MoE rows, {_pct(sum(b_dense) / len(b_dense))} on "
        f"the {len(b_dense)} dense ones; {len(bridge) - len(fit)} are predicted out of memory). "
        "[docs/perf.md](docs/perf.md) has the tables and what dominates each error; `rpeg validate --all` "
        "prints them all. (This paragraph is written by `scripts/docs_validate_blocks.py`, and a test "
        "checks it is current.)\n")


def refresh(text: str) -> str:
    text = BLOCK.sub(lambda m: f"```\n$ rpeg validate {m.group(1)}\n{output(m.group(1))}```", text)
    if SUMMARY.search(text):
        new = summary()
        text = SUMMARY.sub(lambda m: m.group(1) + new + m.group(3), text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("docs", nargs="+")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a block is stale")
    args = ap.parse_args(argv)
    code = 0
    for doc in args.docs:
        text = pathlib.Path(doc).read_text(encoding="utf-8")
        new = refresh(text)
        if not args.check:
            pathlib.Path(doc).write_text(new, encoding="utf-8")
            continue
        stale = [m.group(1) for m, n in zip(BLOCK.finditer(text), BLOCK.finditer(new)) if m.group(0) != n.group(0)]
        if (s := SUMMARY.search(text)) and s.group(0) != SUMMARY.search(new).group(0):
            stale.append("the validation summary")
        for s in stale:
            print(f"{doc}: {s if s.startswith('the ') else f'the block of `rpeg validate {s}`'} is stale",
                  file=sys.stderr)
        code = code or (1 if stale else 0)
    return code


if __name__ == "__main__":
    sys.exit(main())
