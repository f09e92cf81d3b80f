"""Partial rollout: generations in flight when new weights arrive continue with them, each token records
the weight version that sampled it and its logprob under that version (the behaviour policy the
loss reads), and a plan with partial rollout runs end to end within its staleness bound."""

from __future__ import annotations

import pytest
import torch

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.passes import bound_asynchrony, colocate, partial_rollout, place
from rpeg.runtime.models import build_tiny, load
from rpeg.runtime.plan_check import check_plan
from rpeg.runtime.rollout import HFEngine, InFlight, SamplingParams
from rpeg.runtime.run import run
from tests.runtime.test_runtime_e2e import TINY, job, laid_out, rt

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`

PROMPTS = ["12+7=", "3+4=", "40+41=", "9+9="]


def _teacher_forced(model, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


def test_in_flight_generations_take_new_weights_at_the_next_segment(tmp_path):
    old_path, new_path = build_tiny(str(tmp_path / "old")), build_tiny(str(tmp_path / "new"), seed=1)
    (engine_model, tok), (old, _), (new, _) = load(old_path), load(old_path), load(new_path)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS] * 4
    params = SamplingParams(max_new_tokens=7, temperature=0.9)
    engine = HFEngine(engine_model, tok.eos_token_id, tok.pad_token_id)
    state = InFlight(prompts, params, seed=3, segment=3)
    assert not state.advance(engine)  # 3 tokens each on version 0 (random weights rarely say <eos> at once)
    engine.load_weights(new.state_dict(), version=1)  # new weights arrive mid-generation
    while not state.advance(engine):
        pass
    assert state.segments == 3  # 3 + 3 + 1 tokens
    crossed = 0
    for prompt, toks, lps, versions in zip(prompts, state.tokens, state.logprobs, state.versions):
        assert len(toks) == len(lps) == len(versions) and 1 <= len(toks) <= 7
        assert versions == [0] * min(3, len(toks)) + [1] * max(0, len(toks) - 3)
        # each token's logprob is the one its own version gives it after the same prefix
        want = [a if v == 0 else b for a, b, v in zip(_teacher_forced(old, prompt, toks, 0.9),
                                                    _teacher_forced(new, prompt, toks, 0.9), versions)]
        assert max(abs(a - b) for a, b in zip(lps, want)) < 1e-4
        crossed += versions[-1] == 1
    assert crossed > 0  # some responses really were continued by the new weights


def test_without_a_weight_update_every_token_has_the_starting_version(tmp_path):
    model, tok = load(build_tiny(str(tmp_path / "tiny")))
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id)
    engine.version = 4
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    state = InFlight(prompts, SamplingParams(max_new_tokens=5), seed=0, segment=2)
    while not state.advance(engine):
        pass
    assert state.start_version == 4 and all(set(v) <= {4} for v in state.versions)
    assert all(len(t) == 5 or t[-1] == tok.eos_token_id for t in state.tokens)


def _partial_split(k: int = 1):
    g = bound_asynchrony(build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.0), k)
    return laid_out(partial_rollout(place(g, {"gen": 1, "train": 1}, {"generate": "gen"}, default="train")))


def test_partial_rollout_needs_engines_of_their_own():
    g = laid_out(partial_rollout(colocate(bound_asynchrony(build_graph("grpo", job(), Models(actor=TINY)), 1), 1)))
    with pytest.raises(RpegError, match="devices of their own"):
        check_plan(g)
    check_plan(_partial_split())


def test_a_partial_rollout_plan_trains_within_its_bound(tmp_path):
    result = run(_partial_split(1), rt(tmp_path, steps=3, max_new_tokens=4, partial_segment=1, checkpoint_every=0),
                 progress=False)
    m = result.metrics
    assert len(m) == 3 and [x["staleness_max"] for x in m] == [0, 1, 1]
    assert all(1 <= x["versions_per_response_max"] <= 2 and 0 <= x["mixed_version_frac"] <= 1 for x in m)
    assert all("is_ratio_max" in x for x in m)
