"""Pipeline parallelism for the trainer: a decoder-only Hugging Face causal LM cut into `pp` stages
of consecutive decoder layers (the first stage also embeds, the last also norms and projects to the
vocabulary), run with `torch.distributed.pipelining` (GPipe or 1F1B) over the mesh's `pp` dimension.

Each stage keeps the full model's parameter names (`model.layers.5.mlp...`), so a stage's state dict
is a part of the full one and the full weights are the union of the stages'. Between stages travel
the hidden states and the attention mask (as floats: the schedule sends tensors that may carry
gradients); each stage rebuilds the causal mask and positions from it with the model's own mask
function, so every stage's attention is what the unsplit model computes. With tied embeddings (the
first stage's embedding is the last stage's output projection) the two copies' gradients are summed
across the pipeline before each optimizer step, as Megatron does, so both stay equal.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

SCHEDULES = ("1f1b", "gpipe")


class Stage(torch.nn.Module):
    """Layers [lo, hi) of `model` (a `...ForCausalLM` whose decoder is `model.model`)."""

    def __init__(self, model, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        inner = model.model
        self.first, self.last = first, last
        self.config = model.config
        self.model = torch.nn.Module()  # the full model's attribute paths, hence its parameter names
        if first:
            self.model.embed_tokens = inner.embed_tokens
        self.model.layers = torch.nn.ModuleDict({str(i): inner.layers[i] for i in range(lo, hi)})
        self.model.rotary_emb = inner.rotary_emb
        if last:
            self.model.norm = inner.norm
            self.lm_head = model.lm_head

    def decoder_layers(self) -> list[torch.nn.Module]:
        return list(self.model.layers.values())

    def forward(self, x: torch.Tensor, attn: torch.Tensor):
        from transformers.masking_utils import create_causal_mask

        hidden = self.model.embed_tokens(x) if self.first else x
        keep = (attn > 0.5).long()
        pos = (keep.cumsum(-1) - 1).clamp(min=0)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=keep, cache=None,
                                  position_ids=pos)
        rope = self.model.rotary_emb(hidden, pos)
        for layer in self.model.layers.values():
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rope, position_ids=pos)
        if self.last:
            return self.lm_head(self.model.norm(hidden))
        return hidden, attn


def cut(layers: int, pp: int, index: int) -> tuple[int, int]:
    """The decoder layers [lo, hi) of pipeline stage `index` of `pp` (the first stages take one more
    when they do not divide evenly)."""
    if layers < pp:
        from rpeg.errors import RpegError

        raise RpegError(f"pipeline parallelism over {pp} stages needs at least {pp} decoder layers; the model has "
                        f"{layers}")
    base, extra = divmod(layers, pp)
    lo = index * base + min(index, extra)
    return lo, lo + base + (1 if index < extra else 0)


def micro_batches(rows: int, micro_batch: int, at_least: int = 1) -> int:
    """How many equal micro-batches of at most `micro_batch` rows (and at least `at_least` of them,
    when there are that many rows) `rows` splits into: the schedule's point-to-point buffers have one
    shape, so every micro-batch must have the same number of rows."""
    for n in range(max(1, -(-rows // max(1, micro_batch)), min(at_least, rows)), rows + 1):
        if rows % n == 0:
            return n
    return max(1, rows)


class Pipeline:
    """One rank's stage of a pipeline over `group` and the schedules that run it."""

    def __init__(self, stage: Stage, index: int, stages: int, group, schedule: str = "1f1b", tie_group=None):
        if schedule not in SCHEDULES:
            from rpeg.errors import RpegError

            raise RpegError(f"pp_schedule = {schedule!r}: expected one of {', '.join(SCHEDULES)}")
        self.stage, self.index, self.stages, self.group, self.kind = stage, index, stages, group, schedule
        self.first, self.last = index == 0, index == stages - 1
        self.tie_group = tie_group if (self.first or self.last) and stages > 1 else None

    def _schedule(self, n: int, loss_fn):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        device = next(self.stage.parameters()).device
        stage = PipelineStage(self.stage, self.index, self.stages, device, group=self.group)
        # 1F1B needs a micro-batch per stage at least; with fewer rows than stages it is GPipe anyway
        one_f_one_b = self.kind == "1f1b" and loss_fn is not None and n >= self.stages
        klass = Schedule1F1B if one_f_one_b else ScheduleGPipe
        return klass(stage, n_microbatches=n, loss_fn=loss_fn, scale_grads=False)

    def micro_batches(self, rows: int, micro_batch: int, train: bool) -> int:
        """The schedule's micro-batch count for `rows` rows (1F1B's training schedule wants one per stage)."""
        return micro_batches(rows, micro_batch, self.stages if train and self.kind == "1f1b" else 1)

    def run(self, input_ids: torch.Tensor, attn: torch.Tensor, n: int, loss_fn=None, target=None):
        """Forward (and, with `loss_fn`, backward) of the batch in `n` micro-batches; the last stage's
        outputs (forward only) on the last stage, None elsewhere."""
        schedule = self._schedule(n, loss_fn)
        args = (input_ids, attn.float()) if self.first else ()
        kwargs = {"target": target, "losses": []} if self.last and loss_fn is not None else {}
        if loss_fn is None:
            with torch.no_grad():
                out = schedule.eval(*args)
            return out if self.last else None
        schedule.step(*args, **kwargs)
        return None

    def from_last(self, obj):
        """`obj` as the last stage has it, on every stage of the pipeline."""
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, self.stages - 1), group=self.group)
        return box[0]

    def tie_gradients(self) -> None:
        """Sum the tied embedding's two gradients (the first stage's input embedding, the last stage's
        output projection) over their own two-rank group, so both copies take the same step."""
        if self.tie_group is None:
            return
        weight = self.stage.model.embed_tokens.weight if self.first else self.stage.lm_head.weight
        if weight.grad is not None:
            dist.all_reduce(_local(weight.grad), group=self.tie_group)

    def total(self, x: torch.Tensor) -> torch.Tensor:
        """`x` summed over the pipeline's stages (every stage gets the sum)."""
        dist.all_reduce(x, group=self.group)
        return x

    def gathered(self, obj) -> list:
        """Every stage's `obj`, in stage order."""
        out = [None] * self.stages
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def counted(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The parameters whose gradients this stage adds to the global norm: a tied output projection
        is the first stage's embedding, counted there once."""
        if self.tie_group is None or not self.last:
            return params
        return [p for p in params if p is not self.stage.lm_head.weight]


def tie_groups(mesh, pp_dim: int) -> dict[int, object]:
    """For each rank on the first or last pipeline stage, the two-rank process group joining it with
    its peer on the other end (same data- and tensor-parallel index). Every rank creates every group,
    in the same order, as torch.distributed requires."""
    ranks = mesh.mesh.movedim(pp_dim, -1).reshape(-1, mesh.mesh.shape[pp_dim])
    out = {}
    for row in ranks.tolist():
        group = dist.new_group([row[0], row[-1]])
        out[row[0]] = out[row[-1]] = group
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t
