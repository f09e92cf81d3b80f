"""The launch-script reader (rpeg/interop/shell.py): what it follows, and what it says it cannot."""

from __future__ import annotations

import re

import pytest

from rpeg.errors import RpegError
from rpeg.interop.shell import is_unknown, script_command

ENTRY = re.compile(r"^trainer\.main$")


def words(text: str) -> list[str]:
    return script_command(text, ENTRY, "job.sh")[0]


def test_positional_defaults_arithmetic_and_exports():
    text = "NUM_GPUS=${1:-8}\nexport NODES=2\nTOTAL=$((NUM_GPUS * NODES))\npython3 -m trainer.main gpus=$TOTAL \"$@\"\n"
    assert words(text) == ["gpus=16"]


def test_multi_line_quotes_substitution_and_word_splitting():
    text = ('MODE=slow\nA="\n  x.a=1 \\\n  x.b=2"\nB="${A//x./y.}"\n'
            'if [[ $MODE == "fast" ]]; then\n  C=fast\nelse\n  C=slow\nfi\n'
            'python3 -m trainer.main $A $B c=$C\n')
    assert words(text) == ["x.a=1", "x.b=2", "y.a=1", "y.b=2", "c=slow"]


def test_heredocs_functions_and_slurm():
    text = ("#!/bin/bash\n#SBATCH --nodes=4\n#SBATCH --gres=gpu:8\ncat > f.py <<EOF\npython3 -m trainer.main bad=1\n"
            "EOF\nrun() {\n  python3 -m trainer.main nodes=$SLURM_JOB_NUM_NODES gpus=$SLURM_GPUS_PER_NODE x=$1\n}\n"
            "run 7\n")
    assert words(text) == ["nodes=4", "gpus=8", "x=7"]


def test_wrappers_srun_ray_job_submit_and_bash_c():
    text = ('srun -N1 bash -c "pip install ray \\\n && ray job submit --address=x -- python3 -m trainer.main \\\n'
            '   a=1 b=2" &>> log.txt\n')
    assert words(text) == ["a=1", "b=2"]


def test_what_the_reader_cannot_run_is_named():
    text = "HOSTS=$(hostname)\nif [ -d /data ]; then N=4; fi\npython3 -m trainer.main h=$HOSTS n=$N e=$RUNTIME_ENV\n"
    got = words(text)
    assert all(is_unknown(w) for w in got)
    assert "output of a command" in got[0] and "cannot decide" in got[1] and "never set in the script" in got[2]


@pytest.mark.parametrize("text, message", [
    ("for x in 1 2; do\n python3 -m trainer.main a=$x\ndone\n", "runs under line 1: for x in 1 2"),
    ("if [ -f cfg ]; then\n python3 -m trainer.main\nfi\n", "which this reader cannot decide or run"),
    ("python3 main_ppo_split.py a=1\n", "it runs main_ppo_split.py"),
    ("A=\"never closed\npython3 -m trainer.main\n", "is never closed"),
])
def test_refusals_name_their_reason(text, message):
    with pytest.raises(RpegError) as e:
        words(text)
    assert message in str(e.value) and "\n" not in str(e.value)
