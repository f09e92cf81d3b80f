"""The demo's promise in README.md matches the job file and the CI check in the Makefile."""

import pathlib
import re

from rpeg.graph.serde import from_data
from rpeg.runtime.config import RuntimeConfig
from rpeg.spec import load_spec

ROOT = pathlib.Path(__file__).resolve().parents[1]


def make_var(name: str) -> str:
    return re.search(rf"^{name}\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)


def test_the_demo_warmup_stops_at_a_target():
    spec = load_spec(str(ROOT / "examples" / "demo-grpo-tiny.yaml"))
    rt = from_data(RuntimeConfig, spec.runtime, "runtime")
    assert 0 < rt.warmup_target < 0.5 and rt.warmup_sft_steps > 0
    readme = (ROOT / "README.md").read_text()
    assert f"reaches\n{rt.warmup_target:g}" in readme or f"reaches {rt.warmup_target:g}" in readme
    assert f"on {rt.eval_size:,} unseen problems" in readme.replace("\n", " ")


def test_readme_states_the_ci_margin_the_makefile_checks():
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    assert f"at least {make_var('DEMO_MIN_GAIN')} and by at least {make_var('DEMO_MIN_Z')} standard errors" in readme
    assert "make demo-check" in (ROOT / ".ci" / "run").read_text()


def test_the_figures_block_was_filled_by_the_script():
    for doc in ("README.md", "docs/runtime.md"):
        text = (ROOT / doc).read_text()
        block = text.split("<!-- demo-figures:start -->")[1].split("<!-- demo-figures:end -->")[0]
        assert "| seed | threads |" in block and "Held-out sampled accuracy on" in block, doc
