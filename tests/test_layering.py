"""DESIGN.md's layering: planning a job must need neither torch nor ray."""

import pathlib
import re
import subprocess
import sys

CORE = ("graph", "algorithms", "passes", "analysis", "hardware", "perf", "sim", "search")
ROOT = pathlib.Path(__file__).resolve().parents[1] / "rpeg"


def test_core_sources_do_not_import_torch_or_ray():
    pattern = re.compile(r"^\s*(import|from)\s+(torch|ray)\b", re.M)
    offenders = [str(p) for d in CORE if (ROOT / d).exists() for p in (ROOT / d).rglob("*.py")
                 if pattern.search(p.read_text())]
    assert offenders == []


def test_planning_works_with_torch_and_ray_unimportable(tmp_path):
    script = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'ray', 'transformers'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import pkgutil, importlib, rpeg
for m in pkgutil.walk_packages(rpeg.__path__, 'rpeg.'):
    if m.name.split('.')[1] in ('runtime', 'tasks', '__main__'):
        continue
    importlib.import_module(m.name)
from rpeg.cli import main
sys.exit(main(['analyze', 'ppo', '--model', 'llama-3.1-70B', '--json']))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '"critical_path"' in proc.stdout
