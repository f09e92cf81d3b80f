"""Models and tokenizers for the runtime: any local Hugging Face folder, or a tiny one built here.

`build_tiny(path)` writes a 4-layer Qwen2-architecture model (the `tiny-qwen2` preset's shape) and
a character-level tokenizer to a folder with `save_pretrained` (safetensors), so tests and the
demo never download anything. `load(path)` loads any local model folder with
`AutoModelForCausalLM` / `AutoTokenizer` and refuses a missing folder with a clear error.
"""

from __future__ import annotations

import os
import string

from rpeg.errors import RpegError

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = string.digits + "+-*/=()., :>#?\n" + string.ascii_lowercase + string.ascii_uppercase + "\\{}[]_^$"


def quiet() -> None:
    """No progress bars or advisory warnings from transformers in our output."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def build_tokenizer():
    """A character-level tokenizer: every character is a token; <pad>, <bos>, <eos>, <unk>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(dict.fromkeys(CHARS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", padding_side="left")


def build_tiny(path: str, seed: int = 0) -> str:
    """Write the tiny model and its tokenizer to `path`; returns the path."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rpeg.graph import get_model

    quiet()
    spec = get_model("tiny-qwen2")
    tokenizer = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=spec.hidden, intermediate_size=spec.ffn,
                         num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                         num_key_value_heads=spec.kv_heads, max_position_embeddings=512, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def check_folder(path: str, key: str = "model_path") -> None:
    """A Hugging Face model folder, or an RpegError of one line naming `runtime.<key>`."""
    if not os.path.isdir(path):
        raise RpegError(f"runtime.{key}: the model folder {path!r} does not exist (tiny builds the tiny model; a "
                        "GGUF file becomes a folder with `rpeg model convert`, e.g. `make smollm2`)")
    if not os.path.exists(os.path.join(path, "config.json")):
        raise RpegError(f"runtime.{key}: {path!r} has no config.json: not a Hugging Face model folder")


def load(path: str, dtype=None):
    """(model, tokenizer) from a local folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet()
    check_folder(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    except (OSError, ValueError) as e:
        raise RpegError(f"cannot load the model in {path!r}: {str(e).splitlines()[0]}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def build_tiny_reward(path: str, seed: int = 0) -> str:
    """A tiny sequence-classification model (one score per sequence: a reward model's shape) with
    the tiny model's tokenizer, written to `path`; returns the path. Random weights: for tests."""
    import torch
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    from rpeg.graph import get_model

    quiet()
    spec = get_model("tiny-qwen2")
    tokenizer = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=spec.hidden, intermediate_size=spec.ffn,
                         num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                         num_key_value_heads=spec.kv_heads, max_position_embeddings=512, num_labels=1,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0)
    torch.manual_seed(seed + 1)
    model = AutoModelForSequenceClassification.from_config(config)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def load_reward(path: str):
    """(sequence-classification model, tokenizer) from a local folder: a reward model with one label."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    quiet()
    if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "config.json")):
        raise RpegError(f"reward model folder {path!r} is not a Hugging Face model folder (no config.json; "
                        "reward_model_path: tiny builds a tiny one)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise RpegError(f"cannot load the reward model in {path!r}: {str(e).splitlines()[0]}") from None
    if model.config.num_labels != 1:
        raise RpegError(f"reward model in {path!r} has {model.config.num_labels} labels; a reward model scores "
                        "each sequence with one")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"  # the score is read at each sequence's last real token
    return model.eval(), tokenizer


def prompt_ids(tok, prompts: list[str], chat: bool = False) -> list[list[int]]:
    """Token ids of each prompt: as it is, or with `chat` as the user's message in the tokenizer's chat
    template (its default system prompt included), ending where the assistant's answer begins."""
    if not chat:
        return [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    if not getattr(tok, "chat_template", None):
        raise RpegError("runtime.chat is on, but the model's tokenizer has no chat template (tokenizer_config.json "
                        "or chat_template.jinja); set chat: false to give prompts as plain text")
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in prompts]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def autocast(device: str | None, bf16: bool):
    """bf16 autocast for a model on a device (fp32 master weights stay as they are); nothing on the
    default CPU path (device None) or without bf16."""
    import contextlib

    import torch

    if device is None or not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
