"""What the importers and exporters share: one neutral view of a planned RL job.

A `PlanView` is everything a peer's config can say about a job and its plan, in RPEG's terms: the
algorithm and its options, the models (as RPEG presets), the job's sizes, the devices, and the plan
(async bound, partial rollout, critic sharing, fusion, streaming, device groups and which stage runs
where, each model stage's parallel layout, the weight-sync gather). An importer turns a peer's
config into a view (`Imported`); an exporter turns a view into a peer's config (`Exported`).

The view is exact both ways: `view_of(spec.graph())` reads a planned graph, `job_data(view)` writes
the RPEG job file (with the plan as its `passes:`) that builds that same graph again, so
`view_of(load(job_data(v))) == v`. Round trips through a peer (export, then import) are checked on
views: equal fields, equal plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rpeg.algorithms import get_algorithm
from rpeg.errors import RpegError
from rpeg.graph import Graph, Job, Kind, ParallelLayout
from rpeg.graph.catalogue import get_model
from rpeg.graph.lora import MODULES, TARGETS, LoRA
from rpeg.graph.serde import to_data
from rpeg.interop.shell import script_command  # noqa: F401 (launch scripts: the importers read them through it)

# stages that run a model and so carry a layout, in the order the algorithms build them
MODEL_STAGES = ("generate", "generate_greedy", "reward", "actor_logprobs", "ref_logprobs", "critic_values",
                "actor_update", "critic_update")


@dataclass(frozen=True, slots=True)
class PlanView:
    """A job and its plan, as the peers' configs can state them (see the module docstring).

    models: RPEG model names (presets, catalogue ids, config paths); `critic` is None without a critic or
    when it is shared with the actor (`share`); `reward` None: a rule-based reward. `groups`: (name, first
    device, count); `assign`: (stage, group) for every stage but the weight sync; `layouts`: (stage, layout) for every
    model stage; `streams`: (producer, consumer, micro-batches)."""

    algorithm: str
    actor: str
    job: Job
    gpus: int
    critic: str | None = None
    reward: str | None = None
    config: tuple[tuple[str, Any], ...] = ()  # the algorithm options that differ from its defaults
    cluster: str | None = None
    async_bound: int = 0
    partial: bool = False
    share: bool = False
    fusion: tuple[tuple[str, ...], ...] = ()
    streams: tuple[tuple[str, str, int], ...] = ()
    groups: tuple[tuple[str, int, int], ...] = ()
    assign: tuple[tuple[str, str], ...] = ()
    layouts: tuple[tuple[str, ParallelLayout], ...] = ()
    refit_gather: str = "shard"
    reference_on_host: bool = False
    lora: LoRA | None = None  # the actor trains low-rank adapters (rpeg/graph/lora.py)

    def replace(self, **changes) -> PlanView:
        return dataclasses.replace(self, **changes)

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.config)

    def layout(self, stage: str) -> ParallelLayout | None:
        return dict(self.layouts).get(stage)

    def group_of(self, stage: str) -> tuple[str, int, int] | None:
        name = dict(self.assign).get(stage)
        return next((g for g in self.groups if g[0] == name), None)

    def stages(self) -> tuple[str, ...]:
        return tuple(s for s, _ in self.assign)


@dataclass(frozen=True, slots=True)
class Imported:
    """A peer's job read into RPEG: the view, the peer's run mode, and every line the importer could
    not map (`unmapped`) or had to assume because the config does not say (`assumed`)."""

    system: str
    mode: str
    view: PlanView
    unmapped: tuple[str, ...] = ()
    assumed: tuple[str, ...] = ()
    source: str = ""


@dataclass(frozen=True, slots=True)
class Exported:
    """A peer's config written from a view: its text, and one line per part of the plan the peer
    cannot express (those parts are left out of `text`; `view` is the plan the text does say)."""

    system: str
    text: str
    view: PlanView
    left_out: tuple[str, ...] = ()
    filename: str = ""


# ---- reading a planned graph ---------------------------------------------------------------------

def config_overrides(graph: Graph) -> tuple[tuple[str, Any], ...]:
    """The algorithm options of `graph` that differ from its algorithm's defaults, sorted by name."""
    default = algo_options(get_algorithm(graph.algorithm).default)
    now = algo_options(graph.config)
    return tuple(sorted((k, v) for k, v in now.items() if default[k] != v))


def algo_options(config) -> dict[str, Any]:
    """Every field of an AlgoConfig, defaults included (to_data leaves those out)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def config_tuple(algorithm: str, options: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """`options` as a view holds them: checked against AlgoConfig, only those that differ from the
    algorithm's defaults, sorted by name."""
    from rpeg.graph.config import AlgoConfig
    from rpeg.graph.serde import from_data

    default = algo_options(get_algorithm(algorithm).default)
    full = algo_options(from_data(AlgoConfig, {**to_data(get_algorithm(algorithm).default), **options}, "config"))
    return tuple(sorted((k, v) for k, v in full.items() if default[k] != v))


def view_of(graph: Graph, *, actor: str, critic: str | None = None, reward: str | None = None,
            cluster: str | None = None, gpus: int | None = None) -> PlanView:
    """The view of a planned graph (its model preset names passed in: the graph keeps ModelSpecs)."""
    shared = any(h.startswith("share_actor_critic") for h in graph.history)
    if not graph.groups:
        raise RpegError("this job has no plan to read: its passes place no stage on devices "
                        "(`rpeg plan JOB` writes a complete one: rpeg-out/rpeg-plan.yaml)")
    missing = [s.name for s in graph.stages if s.model and s.kind is not Kind.SYNC and s.layout is None]
    if missing:
        raise RpegError(f"this plan gives no parallel layout for {', '.join(missing)} "
                        "(`rpeg plan JOB` writes a complete one: rpeg-out/rpeg-plan.yaml)")
    used = max(g.first + g.count for g in graph.groups)
    return PlanView(
        algorithm=graph.algorithm, actor=actor, critic=None if shared else critic, reward=reward, job=graph.job,
        gpus=gpus or used, config=config_overrides(graph), cluster=cluster, async_bound=graph.async_bound,
        partial=graph.partial_rollout, share=shared, fusion=tuple(tuple(f) for f in graph.fusion),
        streams=tuple((s.producer, s.consumer, s.microbatches) for s in graph.streams),
        groups=tuple((g.name, g.first, g.count) for g in graph.groups),
        assign=tuple((s.name, s.group) for s in graph.stages if s.kind is not Kind.SYNC and s.group),
        layouts=tuple((s.name, s.layout) for s in graph.stages if s.layout is not None and s.kind is not Kind.SYNC),
        refit_gather=graph.refit_gather, reference_on_host=graph.reference_on_host, lora=graph.model("actor").lora)


def load_view(data: dict, source: str = "plan") -> PlanView:
    """The view of an RPEG job file's data whose passes make a complete plan."""
    from rpeg.spec import spec_from_data

    spec = spec_from_data(data, source)
    graph = spec.graph()
    name = _preset_name(data.get("model"), spec.models.actor)
    critic = _preset_name(data.get("critic") or data.get("model"), spec.models.actor) if graph.has_model("critic") \
        or any(h.startswith("share_actor_critic") for h in graph.history) else None
    reward = _preset_name(data["reward"], spec.models.reward) if spec.models.reward is not None else None
    return view_of(graph, actor=name, critic=critic, reward=reward, cluster=spec.cluster, gpus=spec.gpus)


def _preset_name(given: Any, spec) -> str:
    if isinstance(given, str):
        return get_model(given).name
    if isinstance(given, dict) and set(given) == {"preset"}:
        return get_model(given["preset"]).name
    raise RpegError(f"a plan for a peer names its models (a preset, a catalogue id, a config.json or a model folder: "
                    f"`rpeg models --all`), not their dimensions: {spec.name}")


# ---- writing the RPEG job file of a view ---------------------------------------------------------

_LAYOUT_DEFAULT = ParallelLayout()


def layout_data(layout: ParallelLayout) -> dict[str, Any]:
    """A layout's fields that differ from the defaults (dp always), as `parallelize` takes them."""
    out: dict[str, Any] = {"dp": layout.dp}
    for f in dataclasses.fields(ParallelLayout):
        v = getattr(layout, f.name)
        if f.name != "dp" and v != getattr(_LAYOUT_DEFAULT, f.name):
            out[f.name] = list(v) if isinstance(v, tuple) else v  # resident: a YAML list
    return out


def passes_of(view: PlanView) -> list[dict[str, Any]]:
    """The plan of `view` as a job file's `passes:` list (structure first, then execution)."""
    out: list[dict[str, Any]] = []
    if view.share:
        out.append({"share_actor_critic": {}})
    if view.async_bound:
        out.append({"bound_asynchrony": {"k": view.async_bound}})
    if view.partial:
        out.append({"partial_rollout": {}})
    out.append({"place": {"groups": {n: [first, count] for n, first, count in view.groups},
                          "assign": {s: g for s, g in view.assign}}})
    for f in view.fusion:
        out.append({"fuse": {"stages": list(f)}})
    by_m: dict[int, list[list[str]]] = {}
    for p, c, m in view.streams:
        by_m.setdefault(m, []).append([p, c])
    for m, edges in by_m.items():
        out.append({"stream": {"microbatches": m, "edges": edges}})
    if view.refit_gather != "shard":
        out.append({"refit": {"gather": view.refit_gather}})
    if view.reference_on_host:
        out.append({"reference_on_host": {}})
    for stage, lay in view.layouts:
        out.append({"parallelize": {"stage": stage, **layout_data(lay)}})
    return out


def job_data(view: PlanView) -> dict[str, Any]:
    """The RPEG job file (a mapping, as `rpeg predict` / `rpeg train` read it) of `view`."""
    data: dict[str, Any] = {"algorithm": view.algorithm, "model": view.actor}
    if view.critic or view.share:
        data["critic"] = view.critic or view.actor
    if view.reward:
        data["reward"] = view.reward
    if view.lora is not None:
        data["lora"] = to_data(view.lora)
    data["job"] = to_data(view.job)
    if view.config:
        data["config"] = dict(view.config)
    if view.cluster:
        data["cluster"] = view.cluster
    data["gpus"] = view.gpus
    data["passes"] = passes_of(view)
    return data


def graph_of(view: PlanView) -> Graph:
    """The planned graph of `view` (its job file, built)."""
    from rpeg.spec import spec_from_data

    return spec_from_data(job_data(view), "plan").graph()


# ---- what every importer needs -------------------------------------------------------------------

# peft's module names of a Llama/Qwen decoder layer -> LoRA's targets (rpeg/graph/lora.py)
PEFT_MODULES = {name: target for target, name in MODULES.items()}  # peft's module name -> LoRA's target


def lora_of(rank: Any, alpha: Any, modules: Any, dropout: Any, where: str, notes: Notes) -> LoRA | None:
    """A peer's LoRA settings (`where` names its keys): None for rank 0 (LoRA off); peft's `target_modules`
    ("all-linear", a list or a comma-separated string of module names) as LoRA's targets, an unknown
    module named in the notes."""
    if rank in (None, 0):
        return None
    if isinstance(modules, list | tuple) and len(modules) == 1:
        modules = modules[0]
    if isinstance(modules, str) and modules.strip() in ("all-linear", "all_linear"):
        targets = TARGETS
    else:
        names = [m.strip() for m in (modules.split(",") if isinstance(modules, str) else list(modules or []))]
        targets = tuple(dict.fromkeys(PEFT_MODULES[m] for m in names if m in PEFT_MODULES))
        other = [m for m in names if m not in PEFT_MODULES]
        if other:
            notes.assume(f"{where}: target module(s) {', '.join(other)} are not a decoder layer's projections "
                         f"RPEG models ({', '.join(PEFT_MODULES)}): left out of the adapters' cost")
        if not targets:
            raise RpegError(f"{where}: no target module RPEG models among {names} (known: {', '.join(PEFT_MODULES)} "
                            "or all-linear)")
    from rpeg.graph.serde import from_data

    return from_data(LoRA, {"rank": rank, "alpha": alpha, "targets": list(targets), "dropout": dropout or 0.0},
                     where)


def peft_modules(lora: LoRA) -> str:
    """LoRA's targets as peft's `target_modules`: all-linear when it is every projection."""
    if set(lora.targets) == set(TARGETS):
        return "all-linear"
    return ",".join(MODULES[t] for t in lora.targets)


def model_preset(path: Any, key: str, override: str | None = None, notes: Notes | None = None) -> str:
    """The RPEG model a peer's model path or name names (`Qwen/Qwen2.5-7B-Instruct`, `~/models/Qwen3-8B`, a
    local folder with a config.json) at `key`: its name, which names it again in a job file
    (rpeg.graph.catalogue.resolve_model: a preset, a catalogue id, or a config's absolute path); or a
    one-line error naming the key and the way out. What was assumed to name it (a name read by the
    catalogue id it starts with) goes to `notes`."""
    if override:
        return get_model(override).name
    from rpeg.graph.catalogue import resolve_model

    try:
        found = resolve_model(path) if isinstance(path, str) and path.strip() else None
    except RpegError:
        found = None
    if found is None:
        raise RpegError(f"{key} = {path!r}: not a model RPEG knows (a preset or catalogue id: `rpeg models --all`; "
                        "or a folder with a config.json on this machine); name one with --model (a name, a config.json "
                        "or a model folder)")
    if notes is not None:
        for line in found.notes:
            notes.assume(f"{key}: {line}")
    return found.spec.name


@dataclass
class Notes:
    """What an importer collects as it reads: lines it could not map, and assumptions it made."""

    unmapped: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)

    def skip(self, key: str, value: Any, why: str) -> None:
        self.unmapped.append(f"{key} = {_show(value)}: {why}")

    def assume(self, what: str) -> None:
        self.assumed.append(what)


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


# response lengths: a peer's config gives the cap, not the distribution. Reasoning RL responses
# are long-tailed; without a measurement the importer assumes a log-normal whose mean is a third of
# the cap (DAPO's Qwen2.5-32B run: mean ~ 5-7K tokens of a 20K cap in its published curves, arXiv
# 2503.14476 fig. 7) and says so; --response-mean replaces the guess.
RESPONSE_MEAN_OF_MAX = 1 / 3


def response_of(max_tokens: int, mean: float | None, notes: Notes) -> dict[str, Any]:
    if mean is None:
        mean = round(max_tokens * RESPONSE_MEAN_OF_MAX)
        notes.assume(f"response lengths: the config gives only the cap ({max_tokens}); assumed log-normal with "
                     f"mean {mean} (a third of the cap; --response-mean sets it)")
    if mean > max_tokens:
        raise RpegError(f"--response-mean {mean} exceeds the config's response cap of {max_tokens} tokens")
    return {"kind": "lognormal", "mean": float(mean), "max": int(max_tokens)}


# Multi-turn jobs: a peer's config caps an episode's turns and each tool response; the mean turn count
# and the tools' latency are the run's, not the config's. Without them the importer assumes the least
# a tool-using episode has (one tool call, then the answer: 2 replies), observations at their cap (but
# at most half of the response's mean, so replies keep tokens to sample) and an instant tool, and says so.
ASSUMED_TURNS = 2


def episode_of(max_turns: int, observation_cap: float | None, response: dict[str, Any], notes: Notes,
               where: str) -> dict[str, Any]:
    """Job.episode's data for a peer's multi-turn settings (`where` names the keys for the notes)."""
    from rpeg.graph.episode import MAX_TURNS

    cap = max(1, min(int(max_turns), MAX_TURNS))
    turns = min(ASSUMED_TURNS, cap)
    if turns <= 1:
        return {"turns": 1.0, "max_turns": cap}
    obs = float(observation_cap) if observation_cap is not None else 0.0
    obs = min(obs, response["mean"] / 2 / (turns - 1))
    notes.assume(f"{where}: multi-turn episodes of at most {cap} replies; the config gives caps only, so the plan "
                 f"assumes {turns} replies (one tool call or observation between them), {obs:g} observation tokens "
                 f"each and an instant tool: set job.episode (turns, observation_tokens, tool_latency_s) to what "
                 f"your runs measure")
    return {"turns": float(turns), "max_turns": cap, "observation_tokens": obs}


def stage_names(algorithm: str, *, critic: bool, reference: bool, reward_model: bool, share: bool) -> list[str]:
    """The model stages the algorithm's graph has for these models (the order the algorithm builds them)."""
    from rpeg.algorithms import Models, build_graph

    m = get_model("qwen2.5-0.5B")
    models = Models(actor=m, critic=m if critic else None, reward=m if reward_model else None, reference=None)
    # a reference runs exactly when the KL coefficient is above 0 (dapo's and dr_grpo's default is 0)
    g = build_graph(algorithm, Job(), models, kl_coef=0.01 if reference else 0.0)
    names = [s.name for s in g.stages if s.kind is not Kind.SYNC]
    if share:
        names = [n for n in names if n not in ("critic_values", "critic_update")]
    return names


def unshare(view: PlanView) -> PlanView:
    """`view` with its critic a model of its own again (the actor's architecture): the critic's stages
    back, laid out and placed as the actor's forward pass and update (what a peer that cannot share
    the critic would run in their place)."""
    lay = dict(view.layouts)
    names = stage_names(view.algorithm, critic=True, reference="ref_logprobs" in dict(view.assign),
                        reward_model=view.reward is not None, share=False)
    lay["critic_values"], lay["critic_update"] = lay["actor_logprobs"], lay["actor_update"]
    grp = dict(view.assign)
    grp["critic_values"] = grp["critic_update"] = grp["actor_update"]
    return view.replace(share=False, critic=view.actor, assign=tuple((s, grp[s]) for s in names),
                        layouts=tuple((s, lay[s]) for s in names if s in lay))


# ---- what the exporters share ------------------------------------------------------------------------

def one_pass_each(view: PlanView, system: str) -> tuple[PlanView, list[str]]:
    """`view` as a peer that runs every model pass on its own runs it: the critic a model of its own,
    no fused stages, no streamed micro-batches; one line for each of them left out."""
    lines: list[str] = []
    v = view
    if v.share:
        lines.append(f"critic shared with the actor: {system} trains a separate critic model (same architecture here)")
        v = unshare(v)
    if v.fusion:
        lines.append("fused stages (" + "; ".join("+".join(f) for f in v.fusion) + f"): {system} runs each pass on "
                     "its own")
        v = v.replace(fusion=())
    if v.streams:
        lines.append(f"streaming in {v.streams[0][2]} micro-batches: {system} hands each stage the whole batch")
        v = v.replace(streams=())
    return v, lines


def defaults_of(algorithm: str) -> dict[str, Any]:
    """Every option of the algorithm's defaults."""
    return algo_options(get_algorithm(algorithm).default)


def resize(lay: ParallelLayout, n: int) -> ParallelLayout:
    other = lay.tp * lay.pp * lay.cp
    if n % other:
        return lay.replace(dp=max(1, n // other))
    return lay.replace(dp=n // other)


def colocate_all(v: PlanView) -> PlanView:
    """Every stage on one group of all the plan's GPUs; layouts scaled to it (dp grows)."""
    n = v.gpus
    lay = {s: resize(lo, n) for s, lo in v.layouts}
    return v.replace(groups=(("all", 0, n),), assign=tuple((s, "all") for s, _ in v.assign),
                     layouts=tuple((s, lay[s]) for s, _ in v.layouts), async_bound=v.async_bound)


# Hugging Face repositories of the presets' architectures, for the model paths an export writes
HF_NAMES = {
    "qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B-Instruct", "qwen2.5-1.5B": "Qwen/Qwen2.5-1.5B-Instruct",
    "qwen2.5-7B": "Qwen/Qwen2.5-7B-Instruct", "qwen2.5-14B": "Qwen/Qwen2.5-14B-Instruct",
    "qwen2.5-32B": "Qwen/Qwen2.5-32B-Instruct", "qwen2.5-72B": "Qwen/Qwen2.5-72B-Instruct",
    "qwen3-0.6B": "Qwen/Qwen3-0.6B", "qwen3-1.7B": "Qwen/Qwen3-1.7B", "qwen3-4B": "Qwen/Qwen3-4B",
    "qwen3-8B": "Qwen/Qwen3-8B", "qwen3-14B": "Qwen/Qwen3-14B", "qwen3-32B": "Qwen/Qwen3-32B",
    "qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B", "qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
    "llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-3.1-405B": "meta-llama/Llama-3.1-405B-Instruct", "llama-2-7B": "meta-llama/Llama-2-7b-hf",
    "llama-2-13B": "meta-llama/Llama-2-13b-hf", "llama-2-70B": "meta-llama/Llama-2-70b-hf",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
}


def hf_name(preset: str) -> str:
    """A Hugging Face repository of the model's architecture (the config names a path; RPEG knows shapes):
    a preset's from HF_NAMES; a catalogue id (`org/name`) or a local model folder (absolute) is one itself."""
    if preset in HF_NAMES:
        return HF_NAMES[preset]
    if "/" in preset:
        return preset
    raise RpegError(f"model {preset!r} has no Hugging Face repository this export knows; a peer's config loads "
                    f"weights by path (presets with one: {', '.join(HF_NAMES)}; catalogue ids and model folders are "
                    "their own)")
