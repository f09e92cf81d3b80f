"""docs/perf.md lists every global efficiency factor the model uses."""

import pathlib

from rpeg.perf.efficiency import table

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "perf.md"


def test_every_factor_is_documented_with_its_value():
    text = DOC.read_text()
    for name, value, _reason in table():
        assert f"`{name}` | {value:g} |" in text, name
