"""A calculator tool and the arithmetic-with-a-calculator environment (the agent demo's task).

Multi-digit products are hard for a tiny model to compute alone and easy with `calc(347*58)`: the
environment answers `> 20126`, and the model's next reply is scored by the arithmetic task's reward.
`calc` evaluates + - * / ( ) and integers only (Python's `ast`, never `eval`), and refuses operands
past 10**12 so no call can run away.

`latency_s` makes the calculator a remote one: every call waits a round trip drawn from an exponential
distribution of that mean (seeded by the expression, so a run repeats), asynchronously, as a call to a
service does, holding no thread. It is how the planner's tool-latency term is checked against a run
(benchmarks/cpu_local_prediction.py) and how the timeline's tool waits become visible.
"""

from __future__ import annotations

import ast
import asyncio
import operator
import random
from fractions import Fraction

from rpeg.errors import RpegError
from rpeg.tasks.arithmetic import Arithmetic
from rpeg.tasks.environment import ToolEnvironment
from rpeg.tasks.tools import tool

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
LIMIT = 10**12


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        a, b = _value(node.left), _value(node.right)
        if type(node.op) is ast.Div and b == 0:
            raise ZeroDivisionError("division by zero")
        out = OPERATORS[type(node.op)](a, b)
        if abs(out) > LIMIT:
            raise ValueError(f"a result past {LIMIT:.0e}")
        return out
    raise ValueError("only integers and + - * / ( ) are allowed")


@tool(timeout_s=1.0, max_output_chars=64)
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: integers with + - * / and parentheses, e.g. 347*58
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot read {expression.strip()[:40]!r}") from None
    v = _value(tree.body)
    return str(v.numerator) if v.denominator == 1 else f"{float(v):.6g}"


def remote_calc(latency_s: float):
    """`calc` behind a round trip of mean `latency_s` seconds (exponential; its timeout far in the tail)."""
    async def calc_remote(expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: integers with + - * / and parentheses, e.g. 347*58
        """
        await asyncio.sleep(random.Random(expression).expovariate(1.0 / latency_s))
        return calc.fn(expression)

    return tool(calc_remote, name="calc", timeout_s=calc.timeout_s + 20 * latency_s,
                max_output_chars=calc.max_output_chars)


def _demo_call(problem) -> tuple[str, dict, str]:
    expression = problem.prompt.rstrip("=")
    return "calc", {"expression": expression}, calc.fn(expression)


def calculator_env(task: Arithmetic | None = None, *, max_turns: int = 3, tool_reward: float = 0.0,
                   warmup_tool_share: float = 0.0, latency_s: float = 0.0) -> ToolEnvironment:
    """A fresh environment (one per episode) on `task` (default: 3-digit products) with the `calc` tool.
    `warmup_tool_share`: the share of the supervised warm-up's examples that call `calc` before answering;
    `latency_s`: each call's mean round trip (0: a local call)."""
    if isinstance(latency_s, bool) or not isinstance(latency_s, (int, float)) or not 0.0 <= latency_s <= 60.0:
        raise RpegError(f"latency_s must be a number of seconds in [0, 60], got {latency_s!r}")
    if task is None:
        task = Arithmetic(level=3, ops=("mul",))
    if not isinstance(task, Arithmetic):
        raise RpegError(f"the calculator environment runs the arithmetic task, not {getattr(task, 'name', task)!r}")
    return ToolEnvironment(task=task, tools=(remote_calc(latency_s) if latency_s else calc,), max_turns=max_turns, tool_reward=tool_reward,
                           warmup_tool_share=warmup_tool_share, demo_call=_demo_call)
