"""Re-run `rpeg import FILE --from SYSTEM --steps 4 --json` on the peers' example configs and write
the table of docs/interop.md (between `<!-- interop-table:start -->` and `<!-- interop-table:end -->`)
from what it prints, so the figures there are the model's current predictions.

    .venv/bin/python scripts/docs_interop_table.py [--check]

Each row: the peer's plan as configured; RPEG's plan with the job's own structure (execution choices
only: placement, layouts, fusion, streaming); RPEG's plan with the import's defaults (asynchrony up
to k = 1 and partial rollout allowed, the critic kept); what sharing the critic would add (not taken
unless `--allow-share`); RPEG's plan as the peer's config. --check exits 1 if the table differs.
Takes a few minutes (each import runs up to four searches).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import re
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "interop.md"
TABLE = re.compile(r"(<!-- interop-table:start -->\n)(.*?)(<!-- interop-table:end -->)", re.S)
EXAMPLES = [  # (system, file under tests/data/peers/SYSTEM)
    ("verl", "dapo_7b_math_fsdp2_8_8.sh"), ("verl", "run_one_step_off_policy.sh"), ("verl", "run_qwen2-7b_math.sh"),
    ("verl", "run_qwen2-7b_math_megatron.sh"), ("verl", "run_qwen2-7b_rm.sh"), ("verl", "run_qwen3-8b.sh"),
    ("openrlhf", "train_dapo_ray_hybrid_engine.sh"), ("openrlhf", "train_ppo_ray_hybrid_engine.sh"),
    ("openrlhf", "train_reinforce_baseline_hybrid_engine.sh"),
    ("openrlhf", "train_reinforce_baseline_ray_agent_async.sh"),
    ("areal", "boba_grpo.yaml"), ("areal", "gsm8k_grpo.yaml"), ("areal", "gsm8k_grpo_megatron.yaml"),
    ("areal", "gsm8k_ppo.yaml"),
]
MODES = {"sync": "sync", "one-step-off": "one-step-off", "fully-async": "fully-async", "async": "async"}


def imported(system: str, name: str) -> dict:
    from rpeg.cli import main

    buf = io.StringIO()
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(buf):
        rc = main(["import", str(ROOT / "tests" / "data" / "peers" / system / name), "--from", system,
                   "--steps", "4", "--json", "--out", out])
    if rc != 0:
        raise SystemExit(f"rpeg import {system}/{name} exited {rc}")
    return json.loads(buf.getvalue())


def _s(x: float | None) -> str:
    return "does not fit" if x is None else f"{x:.1f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def row(system: str, name: str, data: dict) -> str:
    peer, rpeg = data["plans"][0], (data["plans"][1] if len(data["plans"]) > 1 else None)
    rungs = {r["key"]: r for r in data["structure"]}
    own = rungs["none"]
    mode = data["mode"]
    share = rungs.get("share")
    plan = data["rpeg_plan"].removeprefix("rpeg: ") if data["rpeg_plan"] else "none fits"
    cells = [system, f"`{name}`", MODES.get(mode, mode), str(data["gpus"]), _s(peer["step_s"]),
             f"{_s(own['step_s'])} ({_x(own['speedup'])})",
             f"{_s(rpeg and rpeg['step_s'])} ({_x(rpeg and rpeg['speedup'])})", plan,
             _x(share["this_change"]) if share else "no critic",
             _s(data["export"]["as_written_s"]) if data["export"] else "-", str(len(data["unmapped"]))]
    return "| " + " | ".join(cells) + " |"


def table() -> str:
    head = ("| system | file | mode | GPUs | as configured, s/step | RPEG, job's own structure, s/step (speedup) "
            "| RPEG, default permits, s/step (speedup) | RPEG's plan | sharing the critic would add "
            "| RPEG's plan in the peer's config, s/step | keys not mapped |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for i, (system, name) in enumerate(EXAMPLES):
        print(f"[{i + 1}/{len(EXAMPLES)}] {system} {name}", file=sys.stderr, flush=True)
        rows.append(row(system, name, imported(system, name)))
    return head + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/interop.md's table is not current")
    args = ap.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    if not TABLE.search(text):
        raise SystemExit(f"{DOC}: no <!-- interop-table:start --> ... <!-- interop-table:end --> markers")
    new = TABLE.sub(lambda m: m.group(1) + table() + m.group(3), text)
    if args.check:
        if new != text:
            print(f"{DOC}: the interop table is not current (run scripts/docs_interop_table.py)", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
