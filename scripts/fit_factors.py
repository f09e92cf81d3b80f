"""Fit RPEG's fitted constants (rpeg/perf/fitted.py) across the published rows that exercise them and
write rpeg/data/fitted.yaml: each constant's value, the rows, and the in-sample and leave-one-out
mean absolute percentage errors (each row predicted by constants fitted without it).

    PYTHONPATH=. python scripts/fit_factors.py            # fit and write
    PYTHONPATH=. python scripts/fit_factors.py --dry-run  # fit and print only
    PYTHONPATH=. python scripts/fit_factors.py --only moe-host --only moe-routing  # those groups, others as stored

`--only` is for a quick loop while a mechanism changes: it refits the named groups with the others at
their stored values and writes them over the file's records of those groups; the shipped file comes
from a run without it (the groups share rows, so they settle together).

Deterministic (a bounded grid search refined in log space, rpeg/perf/fit.py): rerunning it on the same
model and rows writes the same file. `rpeg validate --loo` prints what it stored beside fresh predictions.
"""

from __future__ import annotations

import argparse
import sys
import time

from rpeg.errors import RpegError
from rpeg.perf.fit import fit_all, load_all, merged, records, write


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the fit; do not write rpeg/data/fitted.yaml")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    ap.add_argument("--only", action="append", default=[], metavar="GROUP",
                    help="fit this group only (repeatable), the others held at their stored values")
    args = ap.parse_args(argv)
    start = time.time()

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"[{time.time() - start:6.1f} s] {line}", file=sys.stderr, flush=True)

    try:
        declared = load_all()
        fits = fit_all(declared, progress=progress, only=args.only)
    except RpegError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for f in fits:
        values = ", ".join(f"{k} = {v:.4g} {declared[k].unit}" for k, v in f.values.items())
        print(f"{f.group}: {values}\n  {len(f.rows)} rows, in-sample MAPE {f.in_sample_mape:.1%}, "
              f"leave-one-out MAPE {f.loo_mape:.1%}")
        for rid, m, a, b in zip(f.rows, f.measured, f.in_sample, f.loo):
            print(f"    {rid:55s} measured {m:8.2f}  in-sample {a:8.2f} ({(a - m) / m:+.0%})  "
                  f"leave-one-out {b:8.2f} ({(b - m) / m:+.0%})")
    if not args.dry_run:
        data = records(fits, declared)
        write(merged(data) if args.only else data)
        print("wrote rpeg/data/fitted.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
