"""docs/agents.md's example runs as written (in a temporary folder), and its tool's schema is what it says."""

from __future__ import annotations

import os
import re

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "agents.md")


def test_the_agents_example_runs(tmp_path, monkeypatch, capsys):
    with open(DOC, encoding="utf-8") as fh:
        code = re.search(r"```python\n(.*?)```", fh.read(), re.S).group(1)
    assert len(code.strip().splitlines()) <= 30
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/agents.md", "exec"), scope)
    reward, turns, sampled = capsys.readouterr().out.split()
    assert float(reward) in (0.0, 1.0) and 1 <= int(turns) <= 3 and int(sampled) >= int(turns)
    assert scope["multiply"].schema["function"]["parameters"] == {
        "type": "object", "required": ["a", "b"],
        "properties": {"a": {"type": "integer", "description": "the first factor"},
                       "b": {"type": "integer", "description": "the second factor"}}}
