"""Output folders: a bad --out is refused in one line before any work; a failed command leaves no
file and no temporary folder behind; a good one writes all its files."""

from __future__ import annotations

import os
import stat

import pytest

from rpeg.cli import main
from rpeg.errors import RpegError
from rpeg.outfolder import OutputFolder

SHOW = ["show", "grpo", "--model", "qwen3-8B"]
PLAN = ["plan", "grpo", "--model", "qwen3-8B", "--gpus", "8"]


def leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith(".rpeg-out-"))


@pytest.mark.parametrize("make, needle", [
    (lambda d: "", "--out: an empty name; expected an output folder"),
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


# ---- issue 23, item 4: an output under a folder where nothing can be made ------------------------
# /proc takes no new entries, whoever asks; root passes os.access there, so only making one tells
PROC = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
PEER = os.path.join(os.path.dirname(__file__), "data", "peers", "verl", "run_qwen2-7b_math.sh")
DEMO = os.path.join(os.path.dirname(__file__), "..", "examples", "demo-grpo-tiny.yaml")


def _no_work(monkeypatch):
    import importlib

    search = importlib.import_module("rpeg.search.search")
    monkeypatch.setattr(search, "search", lambda *a, **k: pytest.fail("searched before checking --out"))
    import rpeg.hardware.calibrate as calibration

    monkeypatch.setattr(calibration, "_matmul_flop_per_s", lambda *a: pytest.fail("measured before checking --out"))


@PROC
@pytest.mark.parametrize("argv, out", [
    (SHOW, "/proc/rpeg-nothing/x"),  # a FileNotFoundError traceback from the temporary folder before
    (PLAN, "/proc/rpeg-nothing/x"),
    (PLAN, "/proc"),  # the destination itself: /proc exists, and takes nothing
    (["import", PEER, "--from", "verl"], "/proc/rpeg-nothing/x"),
    (["import", PEER, "--from", "verl"], "/proc/self/rpeg-x/y"),
    (["export", "plan.yaml", "--to", "verl"], "/proc/self/rpeg.sh"),
    (["calibrate", "--seconds", "0.05"], "/proc/rpeg-nothing/cpu-local.yaml"),
    (["model", "convert", "smollm2"], "/proc/rpeg-nothing/model"),
])
def test_out_under_proc_is_one_line_before_any_work(capsys, monkeypatch, argv, out):
    _no_work(monkeypatch)
    assert main([*argv, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"rpeg: error: --out {out}: "), err
    assert "cannot" in err


@PROC
def test_train_refuses_a_run_folder_under_proc_before_any_work(capsys, monkeypatch, tmp_path):
    import rpeg.runtime.run as runtime

    monkeypatch.setattr(runtime, "run", lambda *a, **k: pytest.fail("trained before checking the run folder"))
    assert main(["train", DEMO, "--out", "/proc/rpeg-nothing/run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out /proc/rpeg-nothing/run: cannot" in err, err
    job = tmp_path / "job.yaml"
    job.write_text("algorithm: grpo\nmodel: tiny-qwen2\nruntime: {out: /proc/rpeg-nothing/run}\n")
    assert main(["train", str(job)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runtime.out /proc/rpeg-nothing/run: cannot" in err, err


def test_a_special_file_is_never_replaced(tmp_path, capsys, monkeypatch):
    """As root, `rpeg calibrate --out /dev/null` replaced /dev/null with a regular file; a FIFO
    stands for the device here."""
    _no_work(monkeypatch)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for argv in (["calibrate", "--seconds", "0.05"], ["export", "plan.yaml", "--to", "verl"]):
        assert main([*argv, "--out", str(fifo)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--out {fifo}: exists and is not a regular file" in err, err
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_an_input_that_is_not_a_regular_file_is_refused(tmp_path, capsys):
    """`rpeg import /dev/zero` read until memory ran out; a FIFO waited for a writer for ever. A
    writer here lets the old code go on (to fail on the needle) instead of hanging the test."""
    import threading

    fifo = tmp_path / "peer.sh"
    os.mkfifo(fifo)

    def unblock():
        fd = os.open(fifo, os.O_RDWR)  # never blocks; a reader still waiting gets "x" and EOF
        os.write(fd, b"x")
        os.close(fd)

    timer = threading.Timer(5.0, unblock)
    timer.start()
    try:
        assert main(["import", str(fifo), "--from", "verl", "--out", str(tmp_path / "o")]) == 2
    finally:
        timer.cancel()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{fifo}: not a regular file" in err, err


def test_writable_checks_leave_nothing_behind(tmp_path):
    from rpeg.outfolder import writable_file, writable_folder

    assert writable_folder(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert writable_file(str(tmp_path / "a" / "f.yaml")) == str(tmp_path / "a" / "f.yaml")
    assert os.listdir(tmp_path) == []  # the probe folders are gone, and nothing was made
    with pytest.raises(RpegError, match="is a folder; name the file to write"):
        writable_file(str(tmp_path))
    (tmp_path / "file").write_text("x")
    with pytest.raises(RpegError, match="exists and is not a folder"):
        writable_folder(str(tmp_path / "file"))
    with pytest.raises(RpegError, match="is a file, not a folder"):
        writable_file(str(tmp_path / "file" / "f.yaml"))
    if os.path.isdir("/proc/self"):
        with pytest.raises(RpegError, match="--out /proc/rpeg-nothing: cannot"):
            writable_folder("/proc/rpeg-nothing")
