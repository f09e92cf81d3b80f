"""Published comparisons between systems, against the peers' plans (`ratios:` in a validation file).

A ratio entry states a setup (a job, a cluster, a GPU count), two systems, and the published ratio
of their step times (the slower's over the faster's). RPEG builds both systems' plans the way
`rpeg plan` builds the baselines (`rpeg.search.baselines`), predicts each step, and compares the
predicted ratio with the published one. A paper's "average speedup" over several model sizes is an
entry with `models:`: the predicted ratio is then the mean over them (every role of the job, actor,
critic, reference and reward, at that size, as those papers run it).

    ratios:
      - id: hybridflow-ppo-vs-deepspeed-chat
        source: "HybridFlow (arXiv 2409.19256) section 8: average PPO speedup over DeepSpeed-Chat"
        job: {algorithm: ppo, model: llama-2-7B, reward: llama-2-7B,
              job: {prompts: 1024, samples_per_prompt: 1, prompt_len: 1024,
                    response: {kind: fixed, mean: 1024}, mini_batches: 8}}
        models: [llama-2-7B, llama-2-13B, llama-2-70B]   # optional: the mean over these sizes
        system: dgx-a100-80gb
        gpus: 128
        faster: verl
        slower: deepspeed-chat
        ratio: 3.67

This lives in the search layer (not beside the cost functions in `rpeg.perf.validation`) because
it builds the peers' plans, which the search owns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rpeg.errors import RpegError
from rpeg.graph.bounds import MAX_COEF, MAX_GPUS, problem
from rpeg.graph.serde import read_yaml_file
from rpeg.hardware import load_cluster
from rpeg.perf.step import predict_step
from rpeg.search.baselines import BASELINES
from rpeg.search.layouts import LayoutCache
from rpeg.spec import spec_from_data

KEYS = {"id", "source", "job", "models", "system", "gpus", "faster", "slower", "ratio", "notes"}
ROLES = ("model", "critic", "reference", "reward")


@dataclass(frozen=True, slots=True)
class RatioResult:
    id: str
    faster: str
    slower: str
    published: float
    predicted: float | None  # None when a plan of either system fits nowhere
    per_model: tuple[tuple[str, float | None, float | None, float | None], ...]  # (model, faster s, slower s, ratio)
    source: str = ""

    @property
    def off_by(self) -> float | None:
        """predicted / published (1 is exact)."""
        return None if self.predicted is None else self.predicted / self.published


def _text(entry: dict, key: str, where: str) -> str:
    if key not in entry:
        raise RpegError(f"{where}: missing {key!r}")
    value = entry[key]
    if not isinstance(value, str) or not value:
        raise RpegError(f"{where}.{key}: expected a name, got {value!r:.80}")
    return value


def _system(entry: dict, key: str, where: str) -> str:
    name = _text(entry, key, where)
    if name not in BASELINES:
        raise RpegError(f"{where}.{key}: unknown system {name!r} (known: {', '.join(BASELINES)})")
    return name


def predict_ratio(entry: Any, where: str, cache: LayoutCache | None = None) -> RatioResult:
    if not isinstance(entry, dict) or "id" not in entry:
        raise RpegError(f"{where}: expected a mapping with an id")
    unknown = sorted(set(entry) - KEYS, key=str)
    if unknown:
        raise RpegError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    faster, slower = _system(entry, "faster", where), _system(entry, "slower", where)
    if faster == slower:
        raise RpegError(f"{where}: faster and slower are the same system ({faster})")
    ratio = entry.get("ratio")
    bad = problem("ratio", ratio, positive=True, maximum=MAX_COEF) if "ratio" in entry else "missing 'ratio'"
    if bad:
        raise RpegError(f"{where}.ratio: {bad}" if "ratio" in entry else f"{where}: {bad}")
    gpus = entry.get("gpus")
    bad = problem("gpus", gpus, positive=True, maximum=MAX_GPUS)
    if bad or isinstance(gpus, float):
        raise RpegError(f"{where}.gpus: {bad or f'expected a whole number, got {gpus!r}'}")
    system = _text(entry, "system", where)
    job = entry.get("job")
    if not isinstance(job, dict):
        raise RpegError(f"{where}.job: expected a job mapping (the schema of a job file), got {job!r:.80}")
    models = entry.get("models")
    if models is not None and (not isinstance(models, list) or not models
                               or not all(isinstance(m, str) for m in models)):
        raise RpegError(f"{where}.models: expected a list of model names, got {models!r:.80}")
    cluster = load_cluster(system, gpus)
    cache = cache or LayoutCache()
    rows = []
    for name in models or [None]:
        data = dict(job) if name is None else {**job, **{r: name for r in ROLES if r in job or r == "model"}}
        label = name or str(data.get("model"))
        spec = spec_from_data(data, f"{where}.job" + (f" ({name})" if name else ""))
        graph = spec.graph()
        times = []
        for system_name in (faster, slower):
            plan = BASELINES[system_name].build(graph, cluster, gpus, cache)
            pred = predict_step(plan, cluster) if plan is not None else None
            times.append(pred.step_s if pred is not None and pred.fits else None)
        fast_s, slow_s = times
        rows.append((label, fast_s, slow_s, slow_s / fast_s if fast_s and slow_s else None))
    ratios = [r for *_, r in rows]
    predicted = None if any(r is None for r in ratios) else sum(ratios) / len(ratios)
    return RatioResult(id=str(entry["id"]), faster=faster, slower=slower, published=float(ratio),
                       predicted=predicted, per_model=tuple(rows), source=str(entry.get("source", "")))


def ratios_file(path: str) -> list[RatioResult]:
    """Every `ratios:` entry of a validation file (the file's other sections are rpeg.perf.validation's)."""
    return ratios_data(read_yaml_file(path), path)


def ratios_data(data: Any, path: str) -> list[RatioResult]:
    """The `ratios:` entries of a parsed validation file (`path` names it in messages)."""
    if not isinstance(data, dict):
        raise RpegError(f"{path}: expected a mapping with models, training, rl and ratios")
    entries = data.get("ratios") or []
    if not isinstance(entries, list):
        raise RpegError(f"{path}: ratios: expected a list of entries")
    cache = LayoutCache()
    out = []
    for i, entry in enumerate(entries):
        where = f"{path}: ratios[{i}]" + (f" ({entry.get('id')})" if isinstance(entry, dict) else "")
        try:
            out.append(predict_ratio(entry, where, cache))
        except RpegError as e:
            msg = str(e)
            raise RpegError(msg if msg.startswith(path) else f"{where}: {msg}") from None
    return out


def within(results: list[RatioResult], low: float = 0.75, high: float = 1.33) -> list[RatioResult]:
    """The entries whose predicted ratio is within [low, high] x the published one."""
    return [r for r in results if r.off_by is not None and low <= r.off_by <= high]


__all__ = ["RatioResult", "predict_ratio", "ratios_data", "ratios_file", "within"]
