"""The pieces every algorithm builder assembles: the field catalogue and the stage recipes.

A builder says which models run and how advantages are formed; `assemble` turns that into a
verified Graph. Keeping the catalogue here means a field means the same thing in every algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpeg.errors import RpegError
from rpeg.graph.config import AlgoConfig
from rpeg.graph.graph import Graph
from rpeg.graph.job import Job
from rpeg.graph.lora import LoRA
from rpeg.graph.model import ModelSpec
from rpeg.graph.nodes import Field, Granularity, Kind, ModelRole, Stage
from rpeg.graph.verify import verify

FIELDS = {f.name: f for f in (
    Field(name="prompt_ids", dtype="int32", shape=("prompts", "prompt"), doc="prompt tokens"),
    Field(name="sampled_ids", dtype="int32", shape=("gen_batch", "response"),
          doc="every generated response, before dynamic sampling keeps a subset"),
    Field(name="sampled_scores", dtype="fp32", shape=("gen_batch",), doc="reward of every generated response"),
    Field(name="response_ids", dtype="int32", shape=("batch", "response"), doc="sampled response tokens"),
    Field(name="greedy_ids", dtype="int32", shape=("prompts", "response"), doc="greedy response per prompt"),
    Field(name="greedy_scores", dtype="fp32", shape=("prompts",), doc="reward of the greedy response"),
    Field(name="old_logprobs", dtype="fp32", shape=("batch", "response"), doc="log pi_old(a|s) per token"),
    Field(name="ref_logprobs", dtype="fp32", shape=("batch", "response"), doc="log pi_ref(a|s) per token"),
    Field(name="values", dtype="fp32", shape=("batch", "response"), doc="critic value V(s) per token"),
    Field(name="scores", dtype="fp32", shape=("batch",), doc="outcome reward per sequence"),
    Field(name="advantages", dtype="fp32", shape=("batch", "response"), doc="advantage per token"),
    Field(name="returns", dtype="fp32", shape=("batch", "response"), doc="value targets per token"),
)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Models:
    """The models of a pipeline. `critic` and `reference` default to the actor's architecture;
    `reward` None means a rule-based (verifiable) reward that runs no model."""

    actor: ModelSpec
    critic: ModelSpec | None = None
    reference: ModelSpec | None = None
    reward: ModelSpec | None = None
    lora: LoRA | None = None  # the actor (and with lora.critic the critic) trains adapters (rpeg/graph/lora.py)


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """What distinguishes one algorithm's graph from another's."""

    critic: bool = False  # a learned value model (PPO)
    group_baseline: bool = False  # needs >= 2 samples per prompt (GRPO, RLOO, ...)
    greedy_baseline: bool = False  # ReMax: one greedy rollout per prompt as the baseline
    dynamic_sampling: bool = False  # DAPO: generate more, keep groups with mixed rewards
    adv_granularity: Granularity = "sample"  # what the advantage stage needs before it starts
    adv_doc: str = ""


def assemble(algorithm: str, job: Job, models: Models, config: AlgoConfig, recipe: Recipe) -> Graph:
    if recipe.group_baseline and job.samples_per_prompt < 2:
        raise RpegError(f"{algorithm} needs samples_per_prompt >= 2 to form a group baseline, "
                        f"got {job.samples_per_prompt}")
    if recipe.dynamic_sampling and config.oversample <= 1:
        raise RpegError(f"{algorithm}: dynamic sampling needs oversample > 1, got {config.oversample}")
    lora = models.lora
    if lora is not None:
        lora.check(models.actor)
    roles = [ModelRole(name="actor", spec=models.actor, trainable=True, lora=lora)]
    if recipe.critic:
        critic_lora = lora if lora is not None and lora.critic else None
        if critic_lora is not None:
            critic_lora.check(models.critic or models.actor)
        roles.append(ModelRole(name="critic", spec=models.critic or models.actor, trainable=True, heads=("value",),
                               lora=critic_lora))
    if config.uses_reference:  # with LoRA on the actor, the reference is its base, adapters off (unless another)
        base = "actor" if lora is not None and (models.reference is None or models.reference == models.actor) else ""
        roles.append(ModelRole(name="ref", spec=models.reference or models.actor, trainable=False, base_of=base))
    if models.reward is not None:
        roles.append(ModelRole(name="reward", spec=models.reward, trainable=False, heads=("score",)))
    rm = "reward" if models.reward is not None else None

    stages: list[Stage] = []
    if recipe.dynamic_sampling:
        stages += [
            Stage(name="generate", kind=Kind.GENERATE, model="actor", reads=("prompt_ids",),
                  writes=("sampled_ids",), sequences="gen_batch", doc="sample oversampled responses"),
            Stage(name="reward", kind=Kind.REWARD, model=rm, reads=("prompt_ids", "sampled_ids"),
                  writes=("sampled_scores",), sequences="gen_batch", doc="score every sampled response"),
            Stage(name="dynamic_sampling", kind=Kind.COMPUTE, reads=("sampled_ids", "sampled_scores"),
                  writes=("response_ids", "scores"), sequences="gen_batch", granularity="group",
                  doc="keep prompts whose samples' rewards differ, up to the training batch"),
        ]
    else:
        stages += [
            Stage(name="generate", kind=Kind.GENERATE, model="actor", reads=("prompt_ids",),
                  writes=("response_ids",), doc="sample responses"),
            Stage(name="reward", kind=Kind.REWARD, model=rm, reads=("prompt_ids", "response_ids"),
                  writes=("scores",), doc="score responses" + (" with the reward model" if rm else " by rule")),
        ]
    if recipe.greedy_baseline:
        stages += [
            Stage(name="generate_greedy", kind=Kind.GENERATE, model="actor", reads=("prompt_ids",),
                  writes=("greedy_ids",), greedy=True, doc="greedy response per prompt (baseline)"),
            Stage(name="reward_greedy", kind=Kind.REWARD, model=rm, reads=("prompt_ids", "greedy_ids"),
                  writes=("greedy_scores",), doc="score the greedy responses"),
        ]
    stages.append(Stage(name="actor_logprobs", kind=Kind.INFER, model="actor",
                        reads=("prompt_ids", "response_ids"), writes=("old_logprobs",),
                        doc="policy logprobs of the sampled tokens"))
    if config.uses_reference:
        stages.append(Stage(name="ref_logprobs", kind=Kind.INFER, model="ref", reads=("prompt_ids", "response_ids"),
                            writes=("ref_logprobs",), doc="reference logprobs for the KL penalty"))
    if recipe.critic:
        stages.append(Stage(name="critic_values", kind=Kind.INFER, model="critic",
                            reads=("prompt_ids", "response_ids"), writes=("values",), doc="per-token values"))

    adv_reads = ["scores"]
    if recipe.greedy_baseline:
        adv_reads.append("greedy_scores")
    if recipe.critic:
        adv_reads.append("values")
    if config.uses_reference and config.kl_in == "reward":
        adv_reads += ["old_logprobs", "ref_logprobs"]
    adv_writes = ("advantages", "returns") if recipe.critic else ("advantages",)
    stages.append(Stage(name="advantages", kind=Kind.COMPUTE, reads=tuple(adv_reads), writes=adv_writes,
                        granularity=recipe.adv_granularity, doc=recipe.adv_doc))

    actor_reads = ["prompt_ids", "response_ids", "old_logprobs", "advantages"]
    if config.uses_reference and config.kl_in == "loss":
        actor_reads.append("ref_logprobs")
    stages.append(Stage(name="actor_update", kind=Kind.TRAIN, model="actor", reads=tuple(actor_reads),
                        passes=job.ppo_epochs, doc="policy loss, backward, optimizer steps"))
    if recipe.critic:
        stages.append(Stage(name="critic_update", kind=Kind.TRAIN, model="critic",
                            reads=("prompt_ids", "response_ids", "values", "returns"), passes=job.ppo_epochs,
                            doc="value loss, backward, optimizer steps"))
    stages.append(Stage(name="actor_sync", kind=Kind.SYNC, model="actor",
                        doc="new actor weights from the training layout to the generation engine"))

    used = {f for s in stages for f in s.reads + s.writes}
    fields = tuple(f for name, f in FIELDS.items() if name in used)
    graph = Graph(algorithm=algorithm, job=job, config=config, models=tuple(roles), fields=fields,
                  stages=tuple(stages), inputs=("prompt_ids",))
    return verify(graph, f"{algorithm} builder")
