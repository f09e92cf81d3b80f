"""Timelines as Chrome/Perfetto trace JSON and as a Gantt chart PNG.

Trace: one process per device group, one thread per unit (stage or fused group); complete
events ("ph": "X") in microseconds with the step, micro-batch and weight version as args. A
timeline's details (multi-turn episodes: each episode's turns and tool calls, each engine's calls)
get a thread per lane beside their stage's. Open
it in https://ui.perfetto.dev or chrome://tracing. The runtime writes measured timelines in the
same format, so prediction and measurement load side by side.
"""

from __future__ import annotations

import json
from dataclasses import replace

from rpeg.sim.timeline import Timeline

KIND_COLORS = {"generate": "#4c8bd6", "infer": "#6fbf5f", "train": "#e8804a", "reward": "#e8c84a",
               "compute": "#9a9a9a", "sync": "#9b6bd1", "switch": "#d65f5f",
               # inside a generation stage with episodes
               "turn": "#8fb8ea", "tool": "#d6a04c", "environment": "#c9c9c9", "engine": "#2f5f9e",
               # a measured run's restart of its workers after a fault (runtime.run's recovery)
               "recovery": "#b00020"}


def chrome_trace(tl: Timeline, title: str = "rpeg") -> dict:
    everything = tl.records + tl.details
    groups = sorted({r.group for r in everything})
    # stages first; each stage's detail lanes (episodes, engines) after it, in their natural order
    units = sorted({r.unit for r in tl.records}) + sorted({r.unit for r in tl.details} - {r.unit for r in tl.records},
                                                          key=_natural)
    pid = {g: i + 1 for i, g in enumerate(groups)}
    tid = {u: i + 1 for i, u in enumerate(units)}
    events = [{"ph": "M", "name": "process_name", "pid": pid[g], "args": {"name": f"{g} ({tl.source})"}}
              for g in groups]
    events += [{"ph": "M", "name": "thread_name", "pid": pid[r.group], "tid": tid[r.unit], "args": {"name": r.unit}}
               for r in {(r.group, r.unit): r for r in everything}.values()]
    if tl.details:  # keep the lanes in order: each stage, then its episodes and engines
        events += [{"ph": "M", "name": "thread_sort_index", "pid": pid[r.group], "tid": tid[r.unit],
                    "args": {"sort_index": tid[r.unit]}} for r in {(r.group, r.unit): r for r in everything}.values()]
    for n, r in enumerate(everything):
        detail = n >= len(tl.records)
        args = {"step": r.step, "microbatch": r.microbatch, "devices": f"{r.devices[0]}+{r.devices[1]}"}
        if r.weight_version >= 0:
            args["weight_version"] = r.weight_version
        if r.peak_memory_bytes > 0:
            args["peak_memory_gb"] = round(r.peak_memory_bytes / 1e9, 3)
        name = r.label or (f"{r.kind} s{r.step}" if detail else f"{r.unit} s{r.step}")
        events.append({"ph": "X", "name": name, "cat": r.kind, "pid": pid[r.group],
                       "tid": tid[r.unit], "ts": r.start * 1e6, "dur": max(r.seconds, 0.0) * 1e6, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "step_s": tl.step_s, "steps": tl.steps, "source": tl.source}}


def _natural(name: str) -> tuple:
    """'episode 10' after 'episode 9'."""
    head, _, tail = name.rpartition(" ")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def write_trace(tl: Timeline, path: str, title: str = "rpeg") -> str:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(chrome_trace(tl, title), fh)
    return path


def write_gantt(tl: Timeline, path: str, title: str = "", headline: str = "") -> str:
    """A Gantt chart: a row per (device group, unit), bars coloured by kind, labelled by step (`headline`
    replaces the title line that gives the step time, utilization and MFU)."""
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
    ax.set_title(headline or f"{title}  step {tl.step_s:.1f} s, utilization {100 * tl.utilization:.0f}%, MFU "
                 f"{100 * tl.mfu:.1f}% ({tl.source}, numbers are steps)", fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_episodes(tl: Timeline, path: str, lanes: int = 16) -> str | None:
    """The last step's multi-turn episodes as a Gantt chart: the engines' calls and the first `lanes`
    episodes' turns (request to reply) and tool calls. None when the timeline has no episodes (partial
    rollout's segment calls alone are in the trace only)."""
    if not any(r.kind != "engine" for r in tl.details):
        return None
    step = max(r.step for r in tl.details)
    last = [r for r in tl.details if r.step == step]
    episodes = sorted({r.unit for r in last if r.kind != "engine"}, key=_natural)[:lanes]
    shown = tuple(r for r in last if r.kind == "engine" or r.unit in episodes)
    t0 = min(r.start for r in shown)
    shown = tuple(replace(r, start=r.start - t0, end=r.end - t0) for r in shown)
    calls = [r for r in shown if r.kind == "engine"]
    tools = [r for r in shown if r.kind == "tool"]
    headline = (f"step {step + 1} ({tl.source}): {len(calls)} engine calls, {len(tools)} tool calls in the "
                f"{len(episodes)} episodes shown")
    return write_gantt(replace(tl, records=shown, details=()), path, headline=headline)
