"""Tools: the JSON schema from a signature and docstring, argument checks, and calls that never hang."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import pytest

from rpeg.errors import RpegError
from rpeg.tasks.calculator import calc
from rpeg.tasks.chat import PlainFormat, TemplateFormat
from rpeg.tasks.tools import call, check_arguments, tool


GATE = threading.Event()  # holds the "slow" lookup until the test has seen its timeout
RETURNED = threading.Event()  # set when the "slow" lookup's thread gets past the gate


@tool(timeout_s=0.2, max_output_chars=20)
def lookup(city: str, unit: Literal["c", "f"] = "c", days: int | None = None, tags: list[str] | None = None) -> str:
    """Weather for a city.

    Args:
        city: the city's name
        unit: c or f
        days (int): how many days ahead, counted
            from today
    """
    if city == "slow":
        GATE.wait(30.0)
        RETURNED.set()
    if city == "boom":
        raise KeyError(city)
    return city * 10


def test_schema_comes_from_signature_and_docstring():
    assert lookup.schema == {"type": "function", "function": {
        "name": "lookup", "description": "Weather for a city.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "the city's name"},
            "unit": {"type": "string", "enum": ["c", "f"], "description": "c or f"},
            "days": {"type": "integer", "description": "how many days ahead, counted from today"},
            "tags": {"type": "array", "items": {"type": "string"}}}}}}


def test_untyped_or_variadic_parameters_are_refused_by_name():
    with pytest.raises(RpegError, match="parameter 'x': needs a type hint"):
        tool(lambda x: x)
    with pytest.raises(RpegError, match=r"\*args and \*\*kwargs"):
        tool(lambda *a: a)
    with pytest.raises(RpegError, match="timeout_s must be > 0"):
        tool(timeout_s=0)(calc.fn)


def test_arguments_are_checked_against_the_schema():
    assert check_arguments(lookup, {"city": "x"}) is None
    assert "missing argument 'city'" in check_arguments(lookup, {})
    assert "unknown argument 'town'" in check_arguments(lookup, {"city": "x", "town": "y"})
    assert "must be integer, got bool" in check_arguments(lookup, {"city": "x", "days": True})
    assert "must be one of ['c', 'f']" in check_arguments(lookup, {"city": "x", "unit": "k"})


def test_calls_become_observations_whatever_happens():
    async def go():
        out = [await call(lookup, a) for a in ({"city": "abc"}, {"city": "boom"}, {"city": "slow"}, {})]
        waiting = not RETURNED.is_set()  # the slow call was given up at its timeout while its thread still waited
        GATE.set()
        return out, waiting

    ((ok, good), (boom, b), (slow, s), (bad, _)), waiting = asyncio.run(go())
    assert waiting
    assert good and ok == "abcabcabcabcabcabcab... [10 more characters cut]"
    assert not b and boom == "error: lookup: KeyError: 'boom'"
    assert not s and slow == "error: lookup timed out after 0.2 s"
    assert bad == "error: lookup: missing argument 'city'"


def test_calculator_is_exact_and_refuses_anything_else():
    assert calc.fn("347*58") == "20126"
    assert calc.fn("(7+5)/4") == "3"
    assert calc.fn("1/3") == "0.333333"
    for bad in ("__import__('os')", "2**100", "9999999*9999999", "1/0", "x+1"):
        with pytest.raises((ValueError, ZeroDivisionError)):
            calc.fn(bad)


def test_plain_format_reads_calls_with_nested_parentheses_and_positions():
    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    f = PlainFormat()
    calls = f.tool_calls("first add(2, 3) then calc(3*(4+5))", (calc, add))
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 2, "b": 3}), ("calc", {"expression": "3*(4+5)"})]
    assert f.tool_calls("add(x, 1)", (add,))[0].error == "argument 'a' must be integer, got 'x'"
    assert f.tool_calls("the answer is 12", (calc, add)) == []
    assert f.observation([{"role": "tool", "content": "12"}]) == "\n> 12\n"


class _Tok:
    """A tokenizer stand-in with a Qwen-like template (only what TemplateFormat calls)."""

    chat_template = "qwen-like"

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False):
        out = "<|im_start|>system\ntools: " + ",".join(t["function"]["name"] for t in tools) + "<|im_end|>\n" \
            if tools else ""
        for m in messages:
            body = f"<tool_response>{m['content']}</tool_response>" if m["role"] == "tool" else m["content"]
            out += f"<|im_start|>{'user' if m['role'] == 'tool' else m['role']}\n{body}<|im_end|>\n"
        return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_template_format_appends_only_the_observation_and_reads_json_calls():
    f = TemplateFormat(_Tok())
    assert f.opening([{"role": "user", "content": "hi"}], (calc,)) == \
        "<|im_start|>system\ntools: calc<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert f.observation([{"role": "tool", "content": "7"}]) == \
        "<|im_start|>user\n<tool_response>7</tool_response><|im_end|>\n<|im_start|>assistant\n"
    calls = f.tool_calls('ok <tool_call>{"name": "calc", "arguments": {"expression": "1+2"}}</tool_call>'
                         '<tool_call>{"name": "web"}</tool_call><tool_call>{bad</tool_call>', (calc,))
    assert calls[0].arguments == {"expression": "1+2"} and calls[0].error is None
    assert calls[1].error == "unknown tool 'web' (known: calc)"
    assert calls[2].error.startswith("the tool call is not JSON")
    with pytest.raises(RpegError, match="no chat template"):
        TemplateFormat(object())


def test_an_async_tool_waits_on_the_event_loop_holding_no_thread():
    from concurrent.futures import ThreadPoolExecutor

    gate = threading.Event()

    @tool(timeout_s=5.0)
    def blocker(x: str) -> str:
        """Holds the pool's only thread."""
        gate.wait(10.0)
        return x

    @tool(timeout_s=0.3)
    async def remote(x: str) -> str:
        """A service call."""
        await asyncio.sleep(0.01 if x != "hang" else 30.0)
        return x.upper()

    async def go(pool):
        held = asyncio.ensure_future(call(blocker, {"x": "b"}, pool))
        out = [await call(remote, {"x": "ok"}, pool), await call(remote, {"x": "hang"}, pool)]
        busy = not held.done()  # both remote calls returned while the pool's one thread was still held
        gate.set()
        return out, busy, await held

    pool = ThreadPoolExecutor(1)
    (ok, hung), busy, held = asyncio.run(go(pool))
    pool.shutdown()
    assert busy and ok == ("OK", True) and held == ("b", True)
    assert hung == ("error: remote timed out after 0.3 s", False)


def test_a_remote_calculator_waits_its_seeded_round_trip():
    from rpeg.tasks.calculator import calculator_env

    env = calculator_env(latency_s=0.05)
    remote = env.tools[0]
    assert remote.name == "calc" and remote.schema["function"]["parameters"] == calc.schema["function"]["parameters"]
    assert asyncio.run(call(remote, {"expression": "347*58"})) == ("20126", True)
    for bad in (-1.0, 61, True, "1"):
        with pytest.raises(RpegError, match="latency_s must be a number of seconds in"):
            calculator_env(latency_s=bad)


class _SmolTok(_Tok):
    """A template that ignores `tools=`, as SmolLM2's does."""

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False):
        return super().apply_chat_template(messages, None, tokenize, add_generation_prompt)


def test_a_template_that_ignores_tools_gets_them_in_a_system_message():
    f = TemplateFormat(_SmolTok())
    assert not f.renders_tools((calc,)) and TemplateFormat(_Tok()).renders_tools((calc,))
    opening = f.opening([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], (calc,))
    system = opening.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou may call these tools.") and '"name": "calc"' in system
    assert system.endswith("\n\nBe brief.") and opening.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert f.opening([{"role": "user", "content": "hi"}], ()) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_each_format_reads_back_the_call_it_writes():
    for f in (PlainFormat(), TemplateFormat(_Tok())):
        text = f.call("calc", {"expression": "347*58"})
        (c,) = f.tool_calls(text, (calc,))
        assert (c.name, c.arguments, c.error) == ("calc", {"expression": "347*58"}, None)
    assert PlainFormat().call("calc", {"expression": "2*3"}) == "calc(2*3)"
