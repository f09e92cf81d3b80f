"""`rpeg train` on a job whose `model:` is a local model folder: the plan is made for the folder's config and
the run trains the folder's weights (runtime.model_path left out defaults to it)."""

import os

import pytest

from rpeg.cli import main
from rpeg.runtime.models import build_tiny

pytestmark = pytest.mark.long  # a Ray run: the second tier (`make test-long`)


def test_train_from_the_job_model_folder(tmp_path, capsys):
    folder = build_tiny(str(tmp_path / "my-model"), seed=7)  # not the weights `model_path: tiny` would build (seed 0)
    job = tmp_path / "job.yaml"
    job.write_text(f"""algorithm: grpo
model: {folder}
cluster: dgx-h100
gpus: 1
job: {{prompts: 4, samples_per_prompt: 2, prompt_len: 6, response: {{kind: fixed, mean: 3}}, mini_batches: 1}}
config: {{kl_coef: 0.0}}
runtime: {{task: {{name: arithmetic, ops: [add], level: 1}}, steps: 1, max_new_tokens: 3, eval_every: 0,
          eval_size: 8, checkpoint_every: 0, threads: 1, out: {tmp_path / "run"}}}
""")
    assert main(["train", str(job), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "held-out accuracy after 1 steps" in out
    from safetensors.torch import load_file

    trained = load_file(os.path.join(tmp_path / "run", "model", "model.safetensors"))
    start = load_file(os.path.join(folder, "model.safetensors"))
    other = load_file(os.path.join(build_tiny(str(tmp_path / "seed0")), "model.safetensors"))
    key = "model.embed_tokens.weight"
    moved = (trained[key].float() - start[key].float()).abs().max().item()
    apart = (other[key].float() - start[key].float()).abs().max().item()
    assert moved < apart / 10, (moved, apart)  # one small step from the folder's weights, far from seed 0's
