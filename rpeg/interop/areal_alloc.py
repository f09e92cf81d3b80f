"""AReaL's allocation strings: where its engines run and how each is laid out.

The grammar is AReaL's own (areal/api/alloc_mode.py, ALLOCATION_GRAMMAR at v0.5-v1.0.4, and the
backend strings of docs/en/reference/alloc_mode.md):

- one engine: `BACKEND:DIMS`, e.g. `sglang:d4t2`, `fsdp:d8`, `megatron:d2p2t4e4`; DIMS are `d`
  data, `t` tensor, `p` pipeline, `c` context, `e` expert parallel sizes (1 when left out);
  `BACKEND[name]:DIMS` names the engine;
- MoE parallel folding: `megatron:(attn:d4p2t2c2|ffn:d2p2t4e2)`: attention and expert layers laid
  out apart over the same GPUs (the pipeline size shared; `ffn`'s `d` derived when left out);
- a job: `ROLLOUT+TRAIN`, e.g. `sglang:d4+fsdp:d4`; TRAIN without a backend (`sglang:d4+d4`, or a
  bare `d8p1t1`) is FSDP, or Megatron when it has pipeline or expert parallelism (ModelAllocation's
  own choice); `a|b` colocates engines; `+eval` / `+cpu` adds an evaluation engine.

Older forms, read too: AReaL 0.3's `sglang.d4p1t1+d4p1t1` (a dot after the backend; the training
backend then named by `actor.backend: fsdp`), and ReaL's `m` (model parallel: tensor) as in
`sglang.d64p1m1+d32p2m1`.

RPEG lays a hybrid engine out as its attention layout with the expert parallel size of `ffn`; an
`ffn` tensor size other than the attention's (expert tensor parallelism) is read as the attention's
and said so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rpeg.errors import RpegError

INFERENCE = ("sglang", "vllm")
TRAINING = ("fsdp", "megatron", "archon")
_DIMS = re.compile(r"^(?:[dptcem]\d+)+$")


@dataclass(frozen=True)
class Engine:
    """One engine of an allocation: its backend (None: left to AReaL's choice) and sizes d p t c e."""

    backend: str | None
    sizes: dict[str, int]
    notes: tuple[str, ...] = field(default=())

    @property
    def gpus(self) -> int:
        s = self.sizes
        return s["d"] * s["p"] * s["t"] * s["c"]


def _dims(text: str, key: str, spec: str, letters: str = "dptcem") -> dict[str, int]:
    if not _DIMS.match(text) or any(ch not in letters for ch in re.findall(r"[a-z]", text)):
        raise RpegError(f"{key} = {spec!r}: {text!r} is not an AReaL parallel size string (letters "
                        f"{', '.join(letters.replace('m', ''))} each followed by a size, e.g. d4t2)")
    sizes = {k: 1 for k in "dptce"}
    for letter, num in re.findall(r"([dptcem])(\d+)", text):
        if int(num) < 1:
            raise RpegError(f"{key} = {spec!r}: every size must be >= 1")
        sizes["t" if letter == "m" else letter] = int(num)  # ReaL's m: model (tensor) parallel
    return sizes


def parse_engine(spec: Any, key: str) -> Engine:
    """One engine string (`sglang:d4t2`, `megatron:(attn:...|ffn:...)`, `d8`, `sglang.d4p1t1`)."""
    if not isinstance(spec, str) or not spec.strip():
        raise RpegError(f"{key} = {spec!r}: no engine string (AReaL's form: sglang:d4t2, fsdp:d8, megatron:d2p2t2)")
    text = re.sub(r"\s+", "", spec)
    m = re.fullmatch(r"([a-z]+)(?:\[[A-Za-z_][A-Za-z0-9_]*\])?([:.])(.*)", text)
    backend, body = (m.group(1), m.group(3)) if m and m.group(1) in INFERENCE + TRAINING else (None, text)
    if m and m.group(1) not in INFERENCE + TRAINING and not _DIMS.match(text):
        raise RpegError(f"{key} = {spec!r}: backend {m.group(1)!r} is none of AReaL's "
                        f"({', '.join(INFERENCE + TRAINING)})")
    h = re.fullmatch(r"\(?attn:([a-z0-9]+)\|ffn:([a-z0-9]+)\)?", body)
    if h:
        if backend in INFERENCE or backend == "fsdp":
            raise RpegError(f"{key} = {spec!r}: attn|ffn layouts are Megatron's and Archon's (AReaL's own check)")
        attn = _dims(h.group(1), key, spec, "dptc")
        ffn = _dims(h.group(2), key, spec, "dpte")
        ffn_given = dict(re.findall(r"([dpte])(\d+)", h.group(2)))
        if "p" in ffn_given and ffn["p"] != attn["p"]:
            raise RpegError(f"{key} = {spec!r}: attn and ffn must share the pipeline size (AReaL's own check)")
        fd = ffn["d"] if "d" in ffn_given else None
        world = attn["d"] * attn["t"] * attn["p"] * attn["c"]
        ffn_world = (fd or 1) * ffn["p"] * ffn["t"] * ffn["e"]
        if fd is None and world % ffn_world == 0:
            fd = world // ffn_world
            ffn_world *= fd
        if ffn_world != world:
            raise RpegError(f"{key} = {spec!r}: attn's {world} GPUs and ffn's {ffn_world} differ (AReaL's own check)")
        notes = ()
        if ffn["t"] != attn["t"]:
            notes = (f"{key} = {spec}: the expert layers' tensor parallel size t{ffn['t']} read as the attention's "
                     f"t{attn['t']} (RPEG lays experts out with their layer's tensor parallelism)",)
        return Engine(backend or "megatron", {**attn, "e": ffn["e"]}, notes)
    sizes = _dims(body, key, spec)
    if backend is None and (sizes["p"] > 1 or sizes["e"] > 1):
        backend = "megatron"  # ModelAllocation.__post_init__: pipeline or expert parallelism picks Megatron
    return Engine(backend, sizes)


def parse_allocation(spec: Any, key: str) -> tuple[Engine, Engine]:
    """(rollout, training) engines of an `allocation_mode` string."""
    text = re.sub(r"\s+", "", str(spec)) if isinstance(spec, str) else ""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "+" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    if any(p in ("eval", "cpu") for p in parts):
        raise RpegError(f"{key} = {spec!r}: an evaluation-only allocation (+{parts[-1]}): no training to plan")
    if any("|" in re.sub(r"\(attn:[^)]*\)|attn:[a-z0-9]+\|ffn:[a-z0-9]+", "", p) for p in parts):
        raise RpegError(f"{key} = {spec!r}: engines colocated with `|` (AReaL's colocation form) are not read; "
                        "give each engine its own backend string")
    if len(parts) == 1:
        engine = parse_engine(parts[0], key)
        if engine.backend in INFERENCE:
            raise RpegError(f"{key} = {spec!r}: an inference engine alone: no training engine to plan")
        raise RpegError(f"{key} = {spec!r}: a training engine alone, no rollout engine (AReaL's SFT and reward-model "
                        "jobs): not an RL job RPEG plans")
    if len(parts) != 2:
        raise RpegError(f"{key} = {spec!r}: {len(parts)} engines joined by +; RPEG reads rollout+training")
    gen, train = parse_engine(parts[0], key), parse_engine(parts[1], key)
    if gen.backend not in INFERENCE:
        raise RpegError(f"{key} = {spec!r}: the first engine {parts[0]!r} is no rollout engine (sglang or vllm)")
    if train.backend in INFERENCE:
        raise RpegError(f"{key} = {spec!r}: the second engine {parts[1]!r} is no training engine")
    return gen, train
