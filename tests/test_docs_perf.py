"""docs/perf.md lists every global efficiency factor the model uses."""

import pathlib

from rpeg.perf.efficiency import table

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "perf.md"


def test_every_factor_is_documented_with_its_value():
    text = DOC.read_text()
    for name, value, _reason in table():
        assert f"`{name}` | {value:g} |" in text, name


def test_every_validate_block_in_the_docs_is_the_current_output():
    """docs/perf.md's `$ rpeg validate FILE` blocks are what the command prints now
    (scripts/docs_validate_blocks.py docs/perf.md rewrites them)."""
    import sys

    sys.path.insert(0, str(DOC.parents[1] / "scripts"))
    import docs_validate_blocks

    text = DOC.read_text()
    assert docs_validate_blocks.BLOCK.search(text), "no validate block found"
    assert docs_validate_blocks.refresh(text) == text, "run scripts/docs_validate_blocks.py docs/perf.md README.md"


def test_the_readme_summary_of_the_validation_is_current():
    """README's paragraph on the validation (its error figures, counts and ratios) is what
    scripts/docs_validate_blocks.py computes from the shipped files now."""
    import sys

    sys.path.insert(0, str(DOC.parents[1] / "scripts"))
    import docs_validate_blocks

    text = (DOC.parents[1] / "README.md").read_text()
    found = docs_validate_blocks.SUMMARY.search(text)
    assert found, "README has no validate-summary block"
    assert found.group(2) == docs_validate_blocks.summary(), \
        "run scripts/docs_validate_blocks.py docs/perf.md README.md"


def test_every_fitted_constant_is_documented_with_its_value():
    from rpeg.perf.fit import load_all
    from rpeg.perf.fitted import fitted_file

    text = DOC.read_text()
    stored = fitted_file()
    for name in load_all():
        assert f"| `{name}` | {stored[name]['value']:.4g} |" in text, name
