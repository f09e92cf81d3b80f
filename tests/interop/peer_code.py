"""The peers' own code, for the interop tests: verl's Hydra config and checks, a local model folder.

`make test-peers` installs verl 0.9.1, OpenRLHF 0.11.2 and AReaL 1.0.4 (without their GPU
dependencies) into .venv-peers and sets RPEG_REQUIRE_PEERS=1, so a missing package fails there
instead of skipping; in `make test` (no peer installed) the tests that need one skip.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from rpeg.graph import get_model

REQUIRED = bool(os.environ.get("RPEG_REQUIRE_PEERS"))


def need(module: str):
    """The peer's module, or a skip (a failure under RPEG_REQUIRE_PEERS=1)."""
    try:
        return __import__(module)
    except ImportError as e:
        if REQUIRED:
            pytest.fail(f"RPEG_REQUIRE_PEERS=1 but {module} does not import: {e}")
        pytest.skip(f"{module} is not installed (`make test-peers` installs it)")


def hf_folder(root: Path, preset: str) -> Path:
    """A local Hugging Face model folder with the preset's architecture (config.json) and a small
    tokenizer: what verl's HFModelConfig opens when it checks a model path. No weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    spec = get_model(preset)
    folder = root / preset
    if folder.exists():
        return folder
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn, "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads, "vocab_size": spec.vocab, "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16"}))
    words = "abcdefghijklmnopqrstuvwxyz0123456789"
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                            unk_token="<unk>").save_pretrained(folder)
    return folder


def verl_check(words: list[str], mode: str, validate: bool = True):
    """Compose verl's Hydra config from the exported overrides as verl's entry would (its own config
    folder, --config-name, the overrides) and run the checks that entry runs before it starts Ray:
    `validate_config` (main_ppo, one_step_off_policy.main_ppo), or for fully_async_main the
    dataclass conversions and the rollouter's own assertion. Returns the composed config. `validate`
    False: the composition alone (Hydra refuses a key verl's config does not have), for a config whose
    checks need what this machine lacks (LoRA: validate_config asks vLLM's version)."""
    need("verl.utils.config")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import verl
    from rpeg.interop.verl import CONFIG_NAMES
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    pkg = Path(verl.__file__).parent
    folder = {"sync": "trainer/config", "one-step-off": "experimental/one_step_off_policy/config",
              "fully-async": "experimental/fully_async_policy/config"}[mode]
    name = next((w.split("=", 1)[1] for w in words if w.startswith("--config-name=")), CONFIG_NAMES[mode][0])
    overrides = [w for w in words if w and not w.startswith("--")]
    GlobalHydra.instance().clear()
    here = os.getcwd()
    os.chdir(pkg.parent)  # one_step_off_ppo_trainer.yaml finds ppo_trainer at file://verl/trainer/config
    try:
        with initialize_config_dir(config_dir=str(pkg / folder), version_base=None):
            cfg = compose(config_name=name, overrides=overrides)
    finally:
        os.chdir(here)
        GlobalHydra.instance().clear()
    if not validate:
        return cfg
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "fully-async":  # fully_async_main.main and FullyAsyncRollouter._validate_config
            cfg.actor_rollout_ref.rollout.nnodes = cfg.rollout.nnodes
            cfg.actor_rollout_ref.rollout.n_gpus_per_node = cfg.rollout.n_gpus_per_node
            omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
            assert cfg.actor_rollout_ref.rollout.calculate_log_probs, "must rollout calculate log_probs"
            if need_critic(cfg):
                omega_conf_to_dataclass(cfg.critic)
        else:
            validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    return cfg


def openrlhf_check(words: list[str]):
    """Run OpenRLHF's own `train_ppo_ray` argument handling on `words`: the `if __name__ ==
    "__main__":` block of openrlhf/cli/train_ppo_ray.py (its parser, `hierarchize` and every check
    after it), with `train` replaced by a function that returns the parsed args instead of starting
    Ray. The module's top-level imports (ray, deepspeed workers) are not run. Returns the args."""
    need("openrlhf.utils.config")
    import argparse
    import ast
    import datetime
    import importlib.util
    import sys

    spec = importlib.util.find_spec("openrlhf.cli.train_ppo_ray")
    tree = ast.parse(Path(spec.origin).read_text())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    code = compile(ast.Module(body=main.body, type_ignores=[]), spec.origin, "exec")

    class Parsed(Exception):
        pass

    got = {}

    def train(args):
        got["args"] = args
        raise Parsed

    argv = sys.argv
    sys.argv = ["train_ppo_ray", *[w for w in words if w]]
    try:
        exec(code, {"__name__": "__rpeg_check__", "argparse": argparse, "os": os, "datetime": datetime.datetime,
                    "train": train})
    except Parsed:
        pass
    except SystemExit as e:  # argparse's own rejection
        raise AssertionError(f"OpenRLHF's parser rejected the arguments (exit {e.code})") from None
    finally:
        sys.argv = argv
    assert "args" in got, "train_ppo_ray's main block never reached train()"
    return got["args"]


def areal_check(text: str, tmp: Path):
    """Load an experiment YAML as AReaL's entry points do (areal/api/cli_args.py: the YAML merged over
    the structured GRPOConfig / PPOConfig, then OmegaConf.to_object, which runs the dataclasses'
    checks) and parse its backend strings with AReaL's own ModelAllocation; the backends must fit the
    cluster section. Returns the config object. (load_expr_config's name-resolve setup and config dump
    are the launcher's side effects and are left out.)"""
    need("areal.api.cli_args")
    from omegaconf import OmegaConf

    from areal.api.alloc_mode import ModelAllocation
    from areal.api.cli_args import GRPOConfig, PPOConfig, to_structured_cfg

    path = tmp / "experiment.yaml"
    path.write_text(text)
    raw = OmegaConf.load(path)
    cls = PPOConfig if raw.get("critic") is not None else GRPOConfig
    cfg = OmegaConf.to_object(to_structured_cfg(raw, config_cls=cls))
    assert isinstance(cfg, cls)
    used = 0
    for engine in (cfg.rollout, cfg.actor):
        used += ModelAllocation.from_str(engine.backend).parallel.world_size
    for engine in (cfg.ref, cfg.critic):
        if engine is not None and engine.scheduling_strategy.type != "colocation":
            used += ModelAllocation.from_str(engine.backend).parallel.world_size
    assert used <= cfg.cluster.n_nodes * cfg.cluster.n_gpus_per_node, (used, cfg.cluster)
    return cfg
