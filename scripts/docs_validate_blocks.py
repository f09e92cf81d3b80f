"""Re-run every `$ rpeg validate FILE` block of docs/perf.md and write its output in, so the
tables in the docs are the model's current figures (a block whose first line is a `# ...` comment
is a record of an earlier state and is left alone).

    .venv/bin/python scripts/docs_validate_blocks.py docs/perf.md [--check]

Relative paths in a block are taken from the repository root. --check exits 1 if a block differs
(tests/test_docs_perf.py runs it that way).
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


def refresh(text: str) -> str:
    return BLOCK.sub(lambda m: f"```\n$ rpeg validate {m.group(1)}\n{output(m.group(1))}```", text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("doc")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a block is stale")
    args = ap.parse_args(argv)
    text = pathlib.Path(args.doc).read_text(encoding="utf-8")
    new = refresh(text)
    if args.check:
        stale = [m.group(1) for m, n in zip(BLOCK.finditer(text), BLOCK.finditer(new)) if m.group(0) != n.group(0)]
        for s in stale:
            print(f"{args.doc}: the block of `rpeg validate {s}` is stale", file=sys.stderr)
        return 1 if stale else 0
    pathlib.Path(args.doc).write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
