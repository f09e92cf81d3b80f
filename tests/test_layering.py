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


def _imports() -> dict[str, set[str]]:
    """Every rpeg module -> the rpeg modules it imports, at module level or inside functions (an
    import inside a function still makes a cycle; it only hides it from the interpreter)."""
    import ast

    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges[name].update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    target = f"{base}.{a.name}"
                    if target in modules:
                        edges[name].add(target)
                    elif base in modules:
                        edges[name].add(base)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_rpeg():
    edges = _imports()
    assert "rpeg.cli.common" in edges["rpeg.cli.graph"] and "rpeg.hardware.loader" in edges["rpeg.hardware.calibrate"]
    assert _cycles(edges) == []


def test_command_modules_import_the_shared_module_not_each_other():
    edges = _imports()
    commands = {"rpeg.cli.graph", "rpeg.cli.perf", "rpeg.cli.plan", "rpeg.cli.train"}
    for m in commands:
        assert not (edges[m] & (commands | {"rpeg.cli", "rpeg.cli.app"})), (m, edges[m])
