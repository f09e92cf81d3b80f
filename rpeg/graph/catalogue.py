"""Naming a model: presets, the catalogue of published models, and local config.json files.

`resolve_model(ref)` turns any of these into a ModelSpec (`get_model` delegates here):

1. an RPEG preset name (`qwen3-8B`, case-insensitive);
2. a path to a `config.json`, or to a model folder holding one (`~/models/Qwen3-8B/`): read with
   rpeg.graph.hfconfig; the spec is named by the absolute path, so a job file naming it loads from
   any working directory;
3. a catalogue id (rpeg/data/catalogue/models.yaml: Hugging Face ids as launch scripts write them),
   case-insensitive, with or without the organisation (`Qwen/Qwen2.5-3B-Instruct`, `qwen2.5-3b-instruct`);
4. the last part of a path that is not on this machine (`/ckpt/Qwen2.5-3B-Instruct`: a peer's
   script names its cluster's paths), matched as 1 and 3;
5. a naming variant of a catalogue model (`_VARIANTS`: fine-tunes whose names say what they are built on);
6. a name that starts with a catalogue id, then a separator (`gpt-oss-20b-bf16`, `DeepSeek-V3-config-verl`,
   `Qwen3-8B-sft-step200`): the longest such id, with a note saying so (the name is all a peer's script
   gives; `--model` overrides it).

A catalogue entry whose architecture is an RPEG preset resolves to the preset (a test holds the
entry's config.json equal to it); any other is read from its config and named by its id.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from rpeg.errors import RpegError
from rpeg.graph.hfconfig import config_path, load_config, read_config
from rpeg.graph.model import ModelSpec
from rpeg.graph.presets import _PRESETS, model_names

CATALOGUE = "data/catalogue/models.yaml"

# Names that are not catalogue ids but say which catalogue model they are built on, by the first pattern
# that matches the lower-cased name: reward models and fine-tunes named after their base.
_VARIANTS = (
    (r"fsfairx-llama3-rm", "meta-llama/Llama-3.1-8B"),  # sfairXC/FsfairX-LLaMA3-RM-v0.1: a reward model on Llama-3-8B
    (r"llama-?3(\.[0-9])?-8b", "meta-llama/Llama-3.1-8B"), (r"llama-?3(\.[0-9])?-70b", "meta-llama/Llama-3.1-70B"),
    (r"qwen2\.5-(math-|coder-)(\d+(\.\d+)?b)", r"Qwen/Qwen2.5-\2"),
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One catalogue model: its id, other ids with the same config, the config's architecture keys,
    where they come from, the published parameter count and its source, and the preset it equals."""

    id: str
    config: dict[str, Any]
    config_source: str
    params: float
    params_source: str
    aliases: tuple[str, ...] = ()
    preset: str = ""

    def spec(self, name: str | None = None) -> ModelSpec:
        return read_config(self.config, name or self.id, f"{CATALOGUE}: {self.id}")[0]


@functools.cache
def catalogue() -> dict[str, Entry]:
    """The catalogue, by id."""
    from rpeg.graph.serde import parse_yaml

    text = resources.files("rpeg").joinpath(CATALOGUE).read_text(encoding="utf-8")
    data = parse_yaml(text, CATALOGUE)
    out = {}
    for id_, e in data.items():
        where = f"{CATALOGUE}: {id_}"
        missing = [k for k in ("config", "config_source", "params", "params_source") if k not in e]
        if missing:
            raise RpegError(f"{where}: missing {', '.join(missing)}")
        out[id_] = Entry(id=id_, config=e["config"], config_source=e["config_source"], params=float(e["params"]),
                         params_source=e["params_source"], aliases=tuple(e.get("aliases", ())),
                         preset=e.get("preset", ""))
    return out


@functools.cache
def _index() -> dict[str, tuple[Entry, str]]:
    """Lower-cased id, and id without its organisation -> (entry, the id as the catalogue spells it)."""
    out: dict[str, tuple[Entry, str]] = {}
    for e in catalogue().values():
        for spelled in (e.id, *e.aliases):
            out.setdefault(spelled.lower(), (e, spelled))
    for key, value in list(out.items()):
        out.setdefault(key.rsplit("/", 1)[-1], value)
    return out


@dataclass(frozen=True, slots=True)
class Resolved:
    spec: ModelSpec
    kind: str  # "preset", "catalogue" or "config"
    notes: tuple[str, ...] = ()
    source: str = ""  # the catalogue id, or the config.json read


def _preset(name: str) -> ModelSpec | None:
    fn = _PRESETS.get(name.lower())
    return fn() if fn else None


def _from_catalogue(key: str) -> Resolved | None:
    hit = _index().get(key.lower())
    if hit is None:
        return None
    entry, spelled = hit
    if entry.preset:
        return Resolved(_preset(entry.preset), "catalogue", source=entry.id)
    return Resolved(_cached_entry_spec(entry.id, spelled), "catalogue", source=entry.id)


@functools.cache
def _cached_entry_spec(entry_id: str, name: str) -> ModelSpec:
    return catalogue()[entry_id].spec(name)


def get_model(name: str) -> ModelSpec:
    """The model `name` names: a preset, a catalogue id, a config.json or a model folder (`resolve_model`)."""
    return resolve_model(name).spec


def resolve_model(ref: Any, base: str | None = None) -> Resolved:
    """The model `ref` names (see the module docstring); `base`: the folder relative paths start from
    before the working directory (a job file's)."""
    if not isinstance(ref, str) or not ref.strip():
        got = "an empty name" if isinstance(ref, str) else repr(ref)
        raise RpegError(f"a model is a preset, a catalogue id, a config.json or a model folder (see `rpeg models`), "
                        f"got {got}")
    ref = ref.strip()
    spec = _preset(ref)
    if spec is not None:
        return Resolved(spec, "preset", source=spec.name)
    local = _local(ref, base)
    if local is not None:
        spec, notes = _load(local)
        return Resolved(spec, "config", tuple(notes), local)
    found = _from_catalogue(ref)
    if found is None and ("/" in ref or os.sep in ref):  # a path elsewhere: its last part
        last = os.path.basename(os.path.normpath(os.path.expanduser(ref)))
        spec = _preset(last) if last else None
        found = Resolved(spec, "preset", source=spec.name) if spec else _from_catalogue(last) if last else None
    if found is None:
        low = ref.rstrip("/").lower()
        for pattern, target in _VARIANTS:
            m = re.search(pattern, low)
            if m:
                found = _from_catalogue(m.expand(target))
                if found is not None:
                    break
    if found is None:
        found = _by_prefix(os.path.basename(os.path.normpath(os.path.expanduser(ref))) or ref)
    if found is not None:
        return found
    if ref.endswith(".json") and not os.path.exists(os.path.expanduser(ref)):
        raise RpegError(f"model {ref!r}: no such file")
    if ref.endswith(".json") or os.path.isdir(os.path.expanduser(ref)):
        raise RpegError(f"model {ref!r}: no config.json there (a model folder holds one; or name the .json file)")
    close = sorted({e.id for k, (e, _) in _index().items() if ref.lower().split("/")[-1].split("-")[0] in k})
    close = [n for n in model_names() if ref.lower().split("-")[0] in n.lower()] + close
    hint = f"; similar: {', '.join(close[:6])}" if close else ""
    raise RpegError(f"unknown model {ref!r}: not a preset, a catalogue id, or a config.json / model folder here "
                    f"(`rpeg models --all` lists presets and catalogue){hint}")


def _by_prefix(name: str) -> Resolved | None:
    """The catalogue model whose id (without its organisation) begins `name` and is followed by -, _ or .:
    the longest such id (`Qwen2.5-7B` does not begin `Qwen2.5-72B-Instruct`: a digit follows)."""
    low = name.lower()
    best = ""
    for key in _index():
        short = key.rsplit("/", 1)[-1]
        if len(short) > len(best) and len(low) > len(short) and low.startswith(short) and low[len(short)] in "-_.":
            best = short
    if not best:
        return None
    found = _from_catalogue(best)
    spelled = _index()[best][1]
    note = f"{name!r} is read as {spelled} (the name starts with that id; --model names another)"
    return Resolved(found.spec, found.kind, (note,), found.source)


def _local(ref: str, base: str | None) -> str | None:
    """The config.json `ref` names on this machine (relative to `base` first, then the working directory)."""
    expanded = os.path.expanduser(ref)
    candidates = [expanded] if os.path.isabs(expanded) or not base else [os.path.join(base, expanded), expanded]
    for c in candidates:
        found = config_path(c)
        if found:
            return found
    return None


@functools.lru_cache(maxsize=64)
def _load_cached(path: str, mtime: float) -> tuple[ModelSpec, tuple[str, ...]]:
    spec, notes = load_config(path)
    return spec, tuple(notes)


def _load(path: str) -> tuple[ModelSpec, tuple[str, ...]]:
    return _load_cached(path, os.path.getmtime(path))


def model_folder(spec: ModelSpec) -> str | None:
    """The local model folder a spec was read from (its config.json's folder), or None."""
    name = spec.name
    if os.path.isabs(name) and os.path.isfile(os.path.join(name, "config.json")):
        return name
    return None


def model_notes(name: str) -> tuple[str, ...]:
    """What was assumed reading the model `name` (a config of a family RPEG does not read, defaults)."""
    try:
        return resolve_model(name).notes
    except RpegError:
        return ()
