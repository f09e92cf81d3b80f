"""Run `rpeg import` over every peer config of a collection and say, per file, what happened.

    python scripts/import_corpus.py                       # tests/data/peers/{verl,openrlhf,areal}
    python scripts/import_corpus.py --json                # one object per file, and the counts
    python scripts/import_corpus.py DIR [DIR ...]         # folders named verl, openrlhf or areal

Each file is read by the importer of the folder it lies in (`rpeg.interop.<system>.read`) and its
view built into RPEG's planned graph, as `rpeg import` does before it predicts. A file is
"imported" when both succeed, "refused: <message>" when RPEG says why it cannot (an RpegError),
and "crashed: <exception>" on anything else, which is always a bug. SOURCES.md files are skipped.
The script exits 1 when any file crashed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

SYSTEMS = ("verl", "openrlhf", "areal")
DEFAULT = os.path.join(os.path.dirname(__file__), os.pardir, "tests", "data", "peers")


def outcome(system: str, path: str) -> tuple[str, str]:
    """("imported" | "refused" | "crashed", the detail) for one file."""
    from rpeg.errors import RpegError
    from rpeg.interop import system as adapter
    from rpeg.interop.common import graph_of

    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        imported = adapter(system).read(text, os.path.basename(path))
        graph_of(imported.view)
    except RpegError as e:
        return "refused", str(e)
    except Exception as e:  # noqa: BLE001 - a crash is what this script reports
        return "crashed", f"{type(e).__name__}: {e}"
    v = imported.view
    return "imported", f"{v.algorithm} on {v.actor}, {v.gpus} GPUs ({imported.mode})"


def files_of(folders: list[str]) -> list[tuple[str, str]]:
    out = []
    for folder in folders:
        name = os.path.basename(os.path.normpath(folder))
        if name in SYSTEMS:
            out += [(name, os.path.join(folder, f)) for f in sorted(os.listdir(folder)) if f != "SOURCES.md"]
        else:
            out += files_of([os.path.join(folder, s) for s in SYSTEMS if os.path.isdir(os.path.join(folder, s))])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="*", default=[DEFAULT])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = []
    for system, path in files_of(args.folders):
        kind, detail = outcome(system, path)
        rows.append({"system": system, "file": os.path.basename(path), "outcome": kind, "detail": detail})
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("imported", "refused", "crashed")}
    if args.json:
        print(json.dumps({"files": rows, "counts": {"total": len(rows), **counts}}, indent=1))
    else:
        for r in rows:
            print(f"{r['system']}/{r['file']}: {r['outcome']}: {r['detail']}")
        print(f"\n{len(rows)} files: {counts['imported']} imported, {counts['refused']} refused, "
              f"{counts['crashed']} crashed")
    return 1 if counts["crashed"] else 0


if __name__ == "__main__":
    sys.exit(main())
