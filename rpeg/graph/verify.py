"""The verifier: every rule a well-formed graph keeps. Runs after every pass.

Each violation names the rule, the stage and the field (where there is one), so a message reads
`stage 'actor_update', field 'advantages': rule 'read-has-producer': ...`. The rule checks that
passes also use to refuse a request (fusion, streaming, layout) live here, so a graph loaded from
YAML is held to the same rules as one built by passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpeg.errors import RpegError
from rpeg.graph.bounds import MAX_MICROBATCHES
from rpeg.graph.graph import REFIT_GATHERS, Graph
from rpeg.graph.nodes import DIMS, DTYPE_BYTES, MODEL_KINDS, Kind, Stage, Stream


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    message: str
    stage: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = []
        if self.stage:
            where.append(f"stage {self.stage!r}")
        if self.field:
            where.append(f"field {self.field!r}")
        prefix = ", ".join(where) + ": " if where else ""
        return f"{prefix}rule {self.rule!r}: {self.message}"


class VerificationError(RpegError):
    def __init__(self, violations: list[Violation], context: str = ""):
        self.violations = violations
        head = f"{context}: " if context else ""
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        super().__init__(f"{head}{violations[0]}{more}")


def verify(graph: Graph, context: str = "") -> Graph:
    """Return the graph unchanged if it keeps every rule; raise VerificationError otherwise."""
    problems = violations(graph)
    if problems:
        raise VerificationError(problems, context or f"graph {graph.algorithm!r}")
    return graph


def violations(graph: Graph) -> list[Violation]:
    out: list[Violation] = []
    for check in (_names, _fields, _models, _weights, _dataflow):
        out.extend(check(graph))
    if out:  # the execution rules below assume a sound structure
        return out
    for check in (_fusion, _streams, _placement):
        out.extend(check(graph))
    return out


# ---- structure ---------------------------------------------------------------------------------
def _names(g: Graph) -> list[Violation]:
    out = []
    seen: set[str] = set()
    for s in g.stages:
        if s.name in seen:
            out.append(Violation("unique-stage", "two stages share this name", stage=s.name))
        seen.add(s.name)
    seen = set()
    for f in g.fields:
        if f.name in seen:
            out.append(Violation("unique-field", "two fields share this name", field=f.name))
        seen.add(f.name)
    seen = set()
    for m in g.models:
        if m.name in seen:
            out.append(Violation("unique-model", f"two models are called {m.name!r}"))
        seen.add(m.name)
    return out


def _fields(g: Graph) -> list[Violation]:
    out = []
    declared = {f.name for f in g.fields}
    for f in g.fields:
        if f.dtype not in DTYPE_BYTES:
            out.append(Violation("field-dtype", f"dtype {f.dtype!r} is not one of {', '.join(DTYPE_BYTES)}",
                                 field=f.name))
        for d in f.shape:
            if d not in DIMS:
                out.append(Violation("field-shape", f"dimension {d!r} is not one of {', '.join(DIMS)}",
                                     field=f.name))
    for name in g.inputs + g.outputs:
        if name not in declared:
            out.append(Violation("declared-field", "graph input/output is not a declared field", field=name))
    for s in g.stages:
        for f in s.reads + s.writes:
            if f not in declared:
                out.append(Violation("declared-field", "stage uses a field that is not declared", s.name, f))
        if s.sequences not in ("batch", "gen_batch"):
            out.append(Violation("stage-sequences", f"sequences = {s.sequences!r} must be batch or gen_batch",
                                 s.name))
        if s.granularity not in ("sample", "group", "batch"):
            out.append(Violation("stage-granularity", f"granularity = {s.granularity!r} is unknown", s.name))
        if s.microbatches < 1 or s.passes < 1:
            out.append(Violation("stage-counts", f"microbatches = {s.microbatches} and passes = {s.passes} "
                                 "must be >= 1", s.name))
    return out


def _models(g: Graph) -> list[Violation]:
    out = []
    names = {m.name for m in g.models}
    for s in g.stages:
        if s.kind in MODEL_KINDS and s.model is None:
            out.append(Violation("stage-model", f"a {s.kind} stage must name the model it runs", s.name))
        if s.kind is Kind.COMPUTE and s.model is not None:
            out.append(Violation("stage-model", "a compute stage runs no model", s.name))
        if s.model is not None and s.model not in names:
            out.append(Violation("stage-model", f"model {s.model!r} is not one of the graph's models "
                                 f"({', '.join(sorted(names))})", s.name))
        if s.greedy and s.kind is not Kind.GENERATE:
            out.append(Violation("stage-greedy", "only a generate stage can be greedy", s.name))
    used = {s.model for s in g.stages}
    for m in g.models:
        if m.name not in used:
            out.append(Violation("model-used", f"model {m.name!r} is run by no stage"))
    return out


def _weights(g: Graph) -> list[Violation]:
    out = []
    if g.refit_gather not in REFIT_GATHERS:
        out.append(Violation("refit-gather", f"refit gather {g.refit_gather!r} must be one of "
                                             f"{', '.join(REFIT_GATHERS)}"))
    if g.partial_rollout and g.async_bound < 1:
        out.append(Violation("partial-rollout", f"partial rollout carries responses across weight updates: it "
                                                f"needs an async bound k >= 1, not {g.async_bound}"))
    if g.call_sequences < 0 or (g.call_sequences and g.engines_never_drain):
        out.append(Violation("call-sequences", f"generate calls of {g.call_sequences} sequences: must be >= 0, "
                                               "and 0 with partial rollout, several steps in flight or refill"))
    if g.refill and g.async_bound < 1:
        out.append(Violation("refill", "refill admits the next step's prompts through the weight update: it needs "
                                       f"an async bound k >= 1, not {g.async_bound}"))
    if g.reference_on_host:
        why = reference_host_problem(g)
        if why:
            out.append(Violation("reference-on-host", f"reference weights on the host: {why}"))
    if g.async_bound < 0:
        out.append(Violation("async-bound", f"async bound k = {g.async_bound} must be >= 0"))
    if not 1 <= g.in_flight <= max(1, g.async_bound):
        out.append(Violation("in-flight", f"{g.in_flight} steps' prompts in flight: generation runs at most k = "
                                          f"{g.async_bound} steps ahead, so 1 to {max(1, g.async_bound)}"))
    trained: dict[str, list[str]] = {}
    for s in g.stages:
        if s.kind is Kind.TRAIN and s.model is not None:
            trained.setdefault(s.model, []).append(s.name)
    for m in g.models:
        writers = trained.get(m.name, [])
        if m.trainable and len(writers) != 1:
            out.append(Violation("one-writer-per-model", f"trainable model {m.name!r} must be written by exactly "
                                 f"one train stage per step, found {len(writers)} ({', '.join(writers) or 'none'})"))
        if not m.trainable and writers:
            out.append(Violation("frozen-model", f"model {m.name!r} is frozen but trained here", writers[0]))
    for s in g.stages:
        if s.lag < 0:
            out.append(Violation("weight-version", f"lag = {s.lag} must be >= 0", s.name))
        elif s.kind is Kind.GENERATE and s.lag > g.async_bound:
            out.append(Violation("weight-version", f"generation reads weights {s.lag} steps old, more than the "
                                 f"async bound k = {g.async_bound}", s.name))
        elif s.kind is not Kind.GENERATE and s.lag != 0:
            out.append(Violation("weight-version", f"only generation may read stale weights (lag = {s.lag})", s.name))
        if s.kind is Kind.SYNC and s.model not in trained:
            out.append(Violation("sync-trained", f"sync of model {s.model!r}, which no stage trains", s.name))
    return out


def _dataflow(g: Graph) -> list[Violation]:
    out = []
    producer: dict[str, str] = {}
    for s in g.stages:
        for f in s.writes:
            if f in g.inputs:
                out.append(Violation("single-producer", "a graph input is written by a stage", s.name, f))
            elif f in producer:
                out.append(Violation("single-producer", f"also written by stage {producer[f]!r}", s.name, f))
            producer.setdefault(f, s.name)
    for s in g.stages:
        for f in s.reads:
            if f not in producer and f not in g.inputs:
                out.append(Violation("read-has-producer", "no stage writes this field and it is not a graph input",
                                     s.name, f))
            if producer.get(f) == s.name:
                out.append(Violation("acyclic", "stage reads a field it writes itself", s.name, f))
    read = {f for s in g.stages for f in s.reads}
    for f, s in producer.items():
        if f not in read and f not in g.outputs:
            out.append(Violation("field-consumed", "written but never read and not a graph output", s, f))
    if out:
        return out
    try:
        g.topo_order()
    except RpegError as e:
        return [Violation("acyclic", str(e))]
    # A stage that reads model m's weights at step t (lag 0) must run before m is trained at t.
    for t in g.stages:
        if t.kind is not Kind.TRAIN:
            continue
        ancestors = g.ancestors(t.name)
        for s in g.stages:
            if (s.model == t.model and s.name != t.name and s.lag == 0
                    and s.kind in (Kind.GENERATE, Kind.INFER, Kind.REWARD) and s.name not in ancestors):
                out.append(Violation("read-before-update", f"reads {t.model!r} at version t but has no path to "
                                     f"{t.name!r}, which overwrites it at step t", s.name))
    for s in g.stages:
        if s.kind is Kind.SYNC and (s.reads or s.writes):
            out.append(Violation("sync-fields", "a sync stage moves weights, not fields", s.name))
    return out


# ---- execution annotations -----------------------------------------------------------------------
def reference_host_problem(g: Graph) -> str | None:
    """Why the reference's weights cannot be swapped in from host memory for its pass (it borrows
    the actor's model on the actor's training devices), or None if they can."""
    refs = [s for s in g.stages if s.model == "ref" and s.kind is Kind.INFER]
    if not refs:
        return f"graph {g.algorithm!r} runs no reference model"
    train = next((s for s in g.stages if s.kind is Kind.TRAIN and s.model == "actor"), None)
    if train is None:
        return "no actor training stage to borrow the model from"
    for s in refs:
        if s.group is not None and train.group is not None and not g.group(s.group).overlaps(g.group(train.group)):
            return (f"{s.name!r} runs on {s.group!r}, not on the actor's training devices ({train.group!r}): the swap "
                    "borrows the actor's model, so place the reference pass there")
    return None


def fusion_problem(g: Graph, group: tuple[str, ...]) -> str | None:
    """Why the stages of `group` cannot share one pass, or None if they can.

    Stages share a pass when they run together over the same micro-batches on the same devices:
    all TRAIN stages (actor and critic in one pipeline schedule, as RLHFuse's intra-stage fusion),
    or non-TRAIN stages that use one model's weights at one version (one engine: generation that
    also returns the policy's logprobs, or one forward pass that gives logprobs and values) plus
    model-free stages (rule reward, per-sample math) working per sample.
    """
    if len(group) < 2:
        return "fusion needs at least two stages"
    if len(set(group)) != len(group):
        return "a stage is listed twice"
    names = set(g.stage_names)
    missing = [s for s in group if s not in names]
    if missing:
        return f"no stage {missing[0]!r} in graph {g.algorithm!r}"
    stages = [g.stage(s) for s in group]
    sync = [s.name for s in stages if s.kind is Kind.SYNC]
    if sync:
        return f"{sync[0]!r} is a weight sync between layouts and shares no pass with other stages"
    kinds = {s.kind for s in stages}
    if Kind.TRAIN in kinds and kinds != {Kind.TRAIN}:
        other = next(s for s in stages if s.kind is not Kind.TRAIN)
        return (f"train stages can only fuse with other train stages; {other.name!r} is a {other.kind} stage "
                "that must finish before training reads its output")
    if kinds != {Kind.TRAIN}:
        runs = {(s.model, s.lag) for s in stages if s.model is not None}
        if len({m for m, _ in runs}) > 1:
            models = sorted({m for m, _ in runs})
            return (f"the stages run different models ({', '.join(models)}); one pass runs one model's weights "
                    "(stream between them instead)")
        if len(runs) > 1:
            return "the stages read the same model at different weight versions (async lag), so they cannot share a pass"
        if g.config.corrects_off_policy and Kind.GENERATE in kinds and Kind.INFER in kinds:
            return (f"off_policy = {g.config.off_policy!r} weighs each token by the trainer's logprobs over the "
                    "engine's; with the logprob pass fused into generation only the engine's exist")
        coarse = [s.name for s in stages if s.granularity != "sample"]
        if coarse:
            return (f"{coarse[0]!r} needs its whole {g.stage(coarse[0]).granularity} before it can start, "
                    "so it cannot run inside a per-sample pass")
    groups = {s.group for s in stages}
    if len(groups) > 1:
        return f"the stages are placed on different device groups ({', '.join(sorted(map(str, groups)))})"
    # Contracting the group must not create a cycle: no path leaves the group and comes back.
    inside = set(group)
    preds = g.predecessors()
    succ: dict[str, set[str]] = {n: set() for n in preds}
    for n, ps in preds.items():
        for p in ps:
            succ[p].add(n)
    frontier = [n for s in group for n in succ[s] if n not in inside]
    seen: set[str] = set()
    while frontier:
        n = frontier.pop()
        if n in seen:
            continue
        seen.add(n)
        for m in succ[n]:
            if m in inside:
                return (f"stage {n!r} lies between members of the group (it reads one's output and feeds another), "
                        "so they cannot run as one pass")
            frontier.append(m)
    return None


def stream_problem(g: Graph, stream: Stream) -> str | None:
    """Why `consumer` cannot start on parts of `producer`'s output, or None if it can."""
    names = set(g.stage_names)
    for s in (stream.producer, stream.consumer):
        if s not in names:
            return f"no stage {s!r} in graph {g.algorithm!r}"
    prod, cons = g.stage(stream.producer), g.stage(stream.consumer)
    if not set(prod.writes) & set(cons.reads):
        return f"{cons.name!r} reads nothing that {prod.name!r} writes"
    if stream.microbatches < 2:
        return f"streaming needs at least 2 micro-batches, got {stream.microbatches}"
    if stream.microbatches > MAX_MICROBATCHES:
        return f"{stream.microbatches:,} micro-batches exceed {MAX_MICROBATCHES:,} (the most a stream is split into)"
    seqs = g.stage_sequences(prod)
    if stream.microbatches > seqs:
        return f"{stream.microbatches} micro-batches exceed the {seqs:g} sequences {prod.name!r} produces"
    if cons.granularity == "batch":
        return f"{cons.name!r} needs the whole batch before it can start (e.g. batch-wide normalization)"
    if cons.kind is Kind.TRAIN and g.job.mini_batches < 2:
        return (f"{cons.name!r} takes one optimizer step on the whole batch (mini_batches = 1), so it cannot start "
                "on part of it; use more mini-batches")
    if cons.kind is Kind.TRAIN and stream.microbatches % g.job.mini_batches:
        return (f"{stream.microbatches} micro-batches do not split evenly into the {g.job.mini_batches} "
                f"mini-batches {cons.name!r} trains on")
    if cons.granularity == "group" and seqs / stream.microbatches < g.job.samples_per_prompt:
        return (f"{cons.name!r} needs all {g.job.samples_per_prompt} samples of a prompt together; "
                f"{stream.microbatches} micro-batches of {seqs:g} sequences split the groups")
    return None


def layout_problems(g: Graph, stage: Stage) -> list[str]:
    """Every reason the stage's parallel layout does not fit its model, kind and device group."""
    lay = stage.layout
    if lay is None:
        return []
    out = []
    if stage.model is None:
        return [f"stage {stage.name!r} runs no model, so it takes no parallel layout"]
    spec = g.model(stage.model).spec
    if stage.group is not None and any(x.name == stage.group for x in g.groups):
        count = g.group(stage.group).count
        if lay.devices != count:
            out.append(f"{lay.product_terms()} != {count} devices of group {stage.group!r}")
    if spec.heads % lay.tp:
        out.append(f"tp = {lay.tp} does not divide the {spec.heads} attention heads of {spec.name}")
    elif spec.attention != "mla" and spec.kv_heads % lay.tp and lay.tp % spec.kv_heads:
        out.append(f"tp = {lay.tp} neither divides nor is a multiple of the {spec.kv_heads} kv heads of {spec.name}")
    if lay.pp * lay.pp_interleave > spec.layers:
        out.append(f"pp*pp_interleave = {lay.pp}*{lay.pp_interleave} exceeds the {spec.layers} layers of {spec.name}")
    elif spec.layers % lay.pp and not lay.pp_uneven:
        out.append(f"pp = {lay.pp} does not divide the {spec.layers} layers of {spec.name} (pp_uneven=True allows "
                   "unequal stages)")
    elif spec.layers % (lay.pp * lay.pp_interleave) and not lay.pp_uneven:
        out.append(f"pp*pp_interleave = {lay.pp}*{lay.pp_interleave} does not divide the {spec.layers} layers")
    if lay.ep > 1:
        if not spec.is_moe:
            out.append(f"ep = {lay.ep} but {spec.name} has no experts")
        elif spec.experts % lay.ep:
            out.append(f"ep = {lay.ep} does not divide the {spec.experts} experts of {spec.name}")
        elif (lay.dp * lay.cp * lay.tp) % lay.ep:
            out.append(f"ep = {lay.ep} does not divide dp*cp*tp = {lay.dp}*{lay.cp}*{lay.tp} = "
                       f"{lay.dp * lay.cp * lay.tp}")
    if stage.kind is not Kind.TRAIN:
        if lay.zero and not (lay.zero == 3 and stage.kind in (Kind.INFER, Kind.REWARD)):
            out.append(f"zero = {lay.zero} shards optimizer state or gradients, which a {stage.kind} stage does not "
                       "have (a forward pass may shard its weights with zero = 3, as FSDP does)")
        if lay.recompute != "none":
            out.append(f"recompute = {lay.recompute} applies to training only, not to a {stage.kind} stage")
        if lay.offload_optimizer or lay.offload_params or lay.resident or lay.pageable:
            out.append(f"offload_optimizer, offload_params, resident and pageable are a trainer's state, which a "
                       f"{stage.kind} stage does not have")
    if stage.kind is Kind.GENERATE and lay.cp > 1:
        out.append(f"cp = {lay.cp}: generation decodes one token at a time and is not context-parallel here")
    if lay.dp > 1 and g.stage_sequences(stage) < lay.dp:
        out.append(f"dp = {lay.dp} exceeds the {g.stage_sequences(stage):g} sequences the stage processes")
    return out


def _fusion(g: Graph) -> list[Violation]:
    out = []
    seen: dict[str, int] = {}
    for i, group in enumerate(g.fusion):
        for s in group:
            if s in seen and seen[s] != i:
                out.append(Violation("fusion", "stage is in two fusion groups", s))
            seen[s] = i
        why = fusion_problem(g, group)
        if why:
            out.append(Violation("fusion", f"group ({', '.join(group)}): {why}", group[0] if group else None))
    return out


def _streams(g: Graph) -> list[Violation]:
    out = []
    for st in g.streams:
        why = stream_problem(g, st)
        if why:
            out.append(Violation("stream", f"{st.producer} -> {st.consumer}: {why}", st.consumer))
    return out


def _placement(g: Graph) -> list[Violation]:
    out = []
    names = [grp.name for grp in g.groups]
    if len(set(names)) != len(names):
        out.append(Violation("placement", "two device groups share a name"))
    placed = [s for s in g.stages if s.group is not None]
    for s in placed:
        if s.group not in names:
            out.append(Violation("placement", f"device group {s.group!r} is not defined "
                                 f"(groups: {', '.join(names) or 'none'})", s.name))
    if placed and len(placed) != len(g.stages):
        for s in g.stages:
            if s.group is None and s.kind is not Kind.SYNC:
                out.append(Violation("placement", "some stages are placed and this one is not", s.name))
    for s in g.stages:
        for why in layout_problems(g, s):
            out.append(Violation("layout", why, s.name))
    return out

