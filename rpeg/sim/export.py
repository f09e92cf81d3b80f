"""Timelines as Chrome/Perfetto trace JSON and as a Gantt chart PNG.

Trace: one process per device group, one thread per unit (stage or fused group); complete
events ("ph": "X") in microseconds with the step, micro-batch and weight version as args. Open
it in https://ui.perfetto.dev or chrome://tracing. The runtime writes measured timelines in the
same format, so prediction and measurement load side by side.
"""

from __future__ import annotations

import json

from rpeg.sim.timeline import Timeline

KIND_COLORS = {"generate": "#4c8bd6", "infer": "#6fbf5f", "train": "#e8804a", "reward": "#e8c84a",
               "compute": "#9a9a9a", "sync": "#9b6bd1", "switch": "#d65f5f"}


def chrome_trace(tl: Timeline, title: str = "rpeg") -> dict:
    groups = sorted({r.group for r in tl.records})
    units = sorted({r.unit for r in tl.records})
    pid = {g: i + 1 for i, g in enumerate(groups)}
    tid = {u: i + 1 for i, u in enumerate(units)}
    events = [{"ph": "M", "name": "process_name", "pid": pid[g], "args": {"name": f"{g} ({tl.source})"}}
              for g in groups]
    events += [{"ph": "M", "name": "thread_name", "pid": pid[r.group], "tid": tid[r.unit], "args": {"name": r.unit}}
               for r in {(r.group, r.unit): r for r in tl.records}.values()]
    for r in tl.records:
        args = {"step": r.step, "microbatch": r.microbatch, "devices": f"{r.devices[0]}+{r.devices[1]}"}
        if r.weight_version >= 0:
            args["weight_version"] = r.weight_version
        if r.peak_memory_bytes > 0:
            args["peak_memory_gb"] = round(r.peak_memory_bytes / 1e9, 3)
        events.append({"ph": "X", "name": f"{r.unit} s{r.step}", "cat": r.kind, "pid": pid[r.group],
                       "tid": tid[r.unit], "ts": r.start * 1e6, "dur": max(r.seconds, 0.0) * 1e6, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "step_s": tl.step_s, "steps": tl.steps, "source": tl.source}}


def write_trace(tl: Timeline, path: str, title: str = "rpeg") -> str:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(chrome_trace(tl, title), fh)
    return path


def write_gantt(tl: Timeline, path: str, title: str = "") -> str:
    """A Gantt chart: a row per (device group, unit), bars coloured by kind, labelled by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = sorted({(r.group, r.unit) for r in tl.records if r.seconds > 0},
                  key=lambda gu: (gu[0], min(r.start for r in tl.records if (r.group, r.unit) == gu)))
    index = {gu: i for i, gu in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.6))
    for r in tl.records:
        if r.seconds <= 0:
            continue
        y = index[(r.group, r.unit)]
        ax.barh(y, r.seconds, left=r.start, height=0.7, color=KIND_COLORS.get(r.kind, "#777777"),
                edgecolor="white", linewidth=0.4)
        if r.seconds > 0.04 * tl.makespan:
            ax.text(r.start + r.seconds / 2, y, f"{r.step}", ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{g}: {u}" for g, u in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    kinds = sorted({r.kind for r in tl.records if r.seconds > 0})
    ax.legend(handles=[Patch(color=KIND_COLORS.get(k, "#777777"), label=k) for k in kinds], fontsize=7,
              loc="upper left", bbox_to_anchor=(0, -0.12 - 0.4 / max(len(rows), 1)), ncol=len(kinds), frameon=False)
    ax.set_title(f"{title}  step {tl.step_s:.1f} s, utilization {100 * tl.utilization:.0f}%, MFU {100 * tl.mfu:.1f}% "
                 f"({tl.source}, numbers are steps)", fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
