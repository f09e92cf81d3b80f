"""Reading job, cluster and validation files: only regular UTF-8 files of bounded size, bounded
nesting and expansion, no key given twice; each refusal one line naming the file."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rpeg.errors import RpegError
from rpeg.graph.serde import MAX_DEPTH, MAX_FILE_BYTES, MAX_VALUES, parse_yaml, read_yaml_file

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))


def refused(fn, *args) -> str:
    with pytest.raises(RpegError) as e:
        fn(*args)
    text = str(e.value)
    assert "\n" not in text and len(text) < 300, text
    return text


def test_not_utf8(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"algorithm: grpo\nmodel: \xff\xfe\n")
    assert "not UTF-8 text (byte 0xff at offset 23)" in refused(read_yaml_file, str(path))


def test_not_a_regular_file(tmp_path):
    assert "not a regular file" in refused(read_yaml_file, "/dev/zero")
    assert "not a regular file" in refused(read_yaml_file, str(tmp_path))
    assert "No such file" in refused(read_yaml_file, str(tmp_path / "missing.yaml"))


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    code = (f"from rpeg.graph.serde import read_yaml_file\ntry: read_yaml_file({str(fifo)!r})\n"
            "except Exception as e: print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "not a regular file" in out


def test_size_is_bounded(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing is written
    assert "more than the" in refused(read_yaml_file, str(path))


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "a:\n" + "".join(" " * i + "- \n" for i in range(1, 3000)),
                                  "{" + '"a": {' * 5000 + "}" * 5001])
def test_deep_nesting_is_refused(text):
    assert "nested deeper than" in refused(parse_yaml, text, "deep.yaml")


def test_nesting_up_to_the_bound_is_read():
    text = "[" * (MAX_DEPTH - 1) + "1" + "]" * (MAX_DEPTH - 1)
    assert parse_yaml(text) is not None
    assert "nested deeper" in refused(parse_yaml, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "x")


def test_an_alias_bomb_is_refused_before_it_expands():
    assert len(BOMB) < 500
    assert f"more than {MAX_VALUES:,} values" in refused(parse_yaml, BOMB, "bomb.yaml")


def test_keys_given_twice_are_refused():
    assert "bomb.yaml:3:1: key 'model' given twice (first on line 1)" in refused(
        parse_yaml, "model: a\nalgorithm: grpo\nmodel: b\n", "bomb.yaml")
    assert "key 'model' given twice" in refused(parse_yaml, '{"model": "a", "model": "b"}', "j.json")
    assert parse_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}  # same key, other mappings


def test_the_cli_refuses_in_one_line(tmp_path, capsys):
    from rpeg.cli import main

    path = tmp_path / "job.yaml"
    path.write_text(BOMB)
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than" in err and "Traceback" not in err
