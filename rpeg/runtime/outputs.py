"""What a run leaves on disk: metrics lines, atomic checkpoints, the reward curve, the measured
timeline and summary, and the progress bar that reports each step."""

from __future__ import annotations

import json
import os
import shutil

import torch

from rpeg.sim.timeline import Timeline


def append_jsonl(path: str, row: dict) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")
        fh.flush()


def write_jsonl(path: str, rows: list[dict]) -> None:
    """`rows` as the whole of `path`, replaced atomically (a kill leaves the old file or the new one)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in rows)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_atomic(folder: str, step: int, state: dict, keep: int, extra=None) -> str:
    """Write to a temporary folder, fsync, rename into place, then point `latest` at it: a kill at any
    moment leaves the previous checkpoint whole and `latest` naming a complete one. `extra(tmp)`
    writes more into the checkpoint's folder before it is renamed (the policy as a model folder)."""
    os.makedirs(folder, exist_ok=True)
    final = os.path.join(folder, f"step-{step:06d}")
    tmp = os.path.join(folder, f".tmp-step-{step:06d}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    path = os.path.join(tmp, "state.pt")
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    if extra is not None:
        extra(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = os.path.join(folder, "latest")
    with open(pointer + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(os.path.basename(final))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(pointer + ".tmp", pointer)
    done = sorted(d for d in os.listdir(folder) if d.startswith("step-"))
    for old in done[:-keep] if keep > 0 else []:
        shutil.rmtree(os.path.join(folder, old), ignore_errors=True)
    return final


def load_latest(folder: str) -> dict | None:
    pointer = os.path.join(folder, "latest")
    if not os.path.exists(pointer):
        return None
    with open(pointer, encoding="utf-8") as fh:
        name = fh.read().strip()
    return torch.load(os.path.join(folder, name, "state.pt"), weights_only=False)


def write_outputs(out: str, metrics: list, timeline: Timeline, before: dict, after: dict,
                  about: dict | None = None) -> list[str]:
    """The trace, Gantt chart (with episodes: episodes.png, the last step's turns), reward curve and summary.json (accuracies, step time, and `about`:
    seed, threads, warm-up, wall time — what scripts/demo_figures.py reads)."""
    from rpeg.sim.export import write_episodes, write_gantt, write_trace

    files = [write_trace(timeline, os.path.join(out, "timeline.json"), "rpeg train (measured)"),
             write_gantt(timeline, os.path.join(out, "gantt.png"), "measured")]
    drawn = write_episodes(timeline, os.path.join(out, "episodes.png"))  # multi-turn: the last step's episodes
    if drawn:
        files.append(drawn)
    files.append(plot_rewards(out, metrics, before, after))
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump({"accuracy_before": before, "accuracy_after": after, "steps": len(metrics),
                   "mean_step_s": timeline.step_s} | (about or {}), fh, indent=1)
    files.append(os.path.join(out, "summary.json"))
    return files


def plot_rewards(out: str, metrics: list, before: float, after: float) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, [m["reward"] for m in metrics], label="train reward", color="#4c8bd6")
    ax.plot(steps, [m["accuracy"] for m in metrics], label="train accuracy (sampled)", color="#6fbf5f", alpha=0.7)
    tests = [(m["step"], m["test_accuracy"]) for m in metrics if "test_accuracy" in m]
    ax.plot([0] + [s for s, _ in tests], [before["sampled"]] + [a for _, a in tests], "o-",
            label="held-out accuracy (sampled)", color="#e8804a")
    greedy = [(m["step"], m["test_accuracy_greedy"]) for m in metrics if "test_accuracy_greedy" in m]
    ax.plot([0] + [s for s, _ in greedy], [before["greedy"]] + [a for _, a in greedy], "s--",
            label="held-out accuracy (greedy)", color="#9b6bd1", alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"held-out accuracy, sampled {before['sampled']:.2f} -> {after['sampled']:.2f}, greedy "
                 f"{before['greedy']:.2f} -> {after['greedy']:.2f}", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out, "reward.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


class ProgressBar:
    """A progress bar with step, reward, accuracy, step time and staleness (tqdm)."""

    def __init__(self, total: int, start: int, enabled: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=start, disable=not enabled, unit="step", dynamic_ncols=True)

    def update(self, m: dict) -> None:
        self.bar.set_postfix(reward=f"{m['reward']:.2f}", acc=f"{m['accuracy']:.2f}", step_s=f"{m['step_s']:.1f}",
                             stale=f"{m['staleness_max']}")
        self.bar.update(1)

    def back_to(self, step: int) -> None:
        """The run goes on from `step` again (a restart from a checkpoint)."""
        self.bar.n = step
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class WarmupBar:
    """The supervised warm-up's progress: steps, loss, and the last dev accuracy against the target."""

    def __init__(self, total: int, target: float, enabled: bool):
        from tqdm import tqdm

        self.target, self.acc = target, None
        self.bar = tqdm(total=total, disable=not enabled, unit="step", desc="warm-up", dynamic_ncols=True)

    def update(self, step: int, loss: float, acc: float | None) -> None:
        self.acc = acc if acc is not None else self.acc
        post = {"loss": f"{loss:.3f}"}
        if self.target:
            post["dev_acc"] = "-" if self.acc is None else f"{self.acc:.2f}"
            post["target"] = f"{self.target:.2f}"
        if step % 10 == 0 or acc is not None:
            self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
