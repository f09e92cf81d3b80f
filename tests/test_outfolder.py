"""Output folders: a bad --out is refused in one line before any work; a failed command leaves no
file and no temporary folder behind; a good one writes all its files."""

from __future__ import annotations

import os

import pytest

from rpeg.cli import main
from rpeg.errors import RpegError
from rpeg.outfolder import OutputFolder

SHOW = ["show", "grpo", "--model", "qwen3-8B"]
PLAN = ["plan", "grpo", "--model", "qwen3-8B", "--gpus", "8"]


def leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith(".rpeg-out-"))


@pytest.mark.parametrize("make, needle", [
    (lambda d: "", "an output folder is needed"),
    (lambda d: (d / "file").write_text("x") and str(d / "file"), "exists and is not a folder"),
    (lambda d: (d / "file").write_text("x") and str(d / "file" / "sub"), "is a file, not a folder"),
])
@pytest.mark.parametrize("argv", [SHOW, PLAN], ids=["show", "plan"])
def test_bad_out_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, argv, make, needle):
    import importlib

    search = importlib.import_module("rpeg.search.search")  # the module; rpeg.search.search is also the function
    monkeypatch.setattr(search, "search", lambda *a, **k: pytest.fail("searched before checking --out"))
    assert main([*argv, "--out", make(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert leftovers(tmp_path) == []


def test_a_folder_in_the_way_leaves_nothing_behind(tmp_path, capsys):
    (tmp_path / "grpo.png").mkdir()
    assert main([*SHOW, "--out", str(tmp_path)]) == 2
    assert "grpo.png is a folder" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["grpo.png"]  # no grpo.dot, no temporary folder


def test_a_failure_while_writing_leaves_nothing_behind(tmp_path, monkeypatch):
    import rpeg.graph.draw as draw

    def broken(g, path, title=None):
        raise RuntimeError("disk full")

    monkeypatch.setattr(draw, "draw_png", broken)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        main([*SHOW, "--out", str(out)])
    assert not out.exists() and leftovers(tmp_path) == []


def test_good_runs_write_every_file_into_a_new_nested_folder(tmp_path, capsys):
    out = tmp_path / "a" / "b"
    assert main([*SHOW, "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["grpo.dot", "grpo.png"] and leftovers(tmp_path) == []
    assert main([*PLAN, "--out", str(out)]) == 0
    assert {"plan-trace.json", "plan-gantt.png", "grpo.dot"} <= set(os.listdir(out))
    assert leftovers(tmp_path / "a") == []


def test_commit_moves_files_in_order(tmp_path):
    out = OutputFolder(str(tmp_path / "o"))
    with out:
        for name in ("b.txt", "a.txt"):
            with open(out.file(name), "w") as fh:
                fh.write(name)
        paths = out.commit()
    assert [os.path.basename(p) for p in paths] == ["b.txt", "a.txt"]
    assert (tmp_path / "o" / "a.txt").read_text() == "a.txt" and leftovers(tmp_path) == []
    with pytest.raises(RpegError, match="an output folder is needed"):
        OutputFolder("  ")
