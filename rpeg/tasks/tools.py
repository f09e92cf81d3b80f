"""Tools an agent may call: typed Python functions, their JSON schema, and a call that never hangs.

`@tool` turns a function into a `Tool` whose JSON schema (the `{"type": "function", "function":
{...}}` form chat templates take as `tools=`) comes from its signature and docstring, the convention of
TRL, verifiers and verl's `@function_tool`:

    @tool(timeout_s=2.0)
    def calc(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: digits and + - * / ( ), e.g. "12*(3+4)"
        '''

Every parameter needs a type hint (str, int, float, bool, list[...], Literal[...], or X | None); the
docstring's first paragraph is the description and its `Args:` lines describe the parameters.

`await call(tool, arguments, pool)` runs the function on a thread pool, off the event loop, so a slow
tool never blocks other episodes' generation; an `async def` tool (a call to a remote service) is
awaited on the event loop itself and holds no thread while it waits. Whatever happens becomes the observation the model reads:
the result as a string (cut to `max_output_chars`), or `error: ...` for bad arguments, an exception or
a timeout. A timed-out call's thread is left to finish on its own (Python cannot stop a thread; an async
tool is cancelled); the episode goes on without it.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import types
import typing
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

from rpeg.errors import RpegError

ERROR_CHARS = 200  # an error is cut here at the least, so the model reads what went wrong
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclass(frozen=True, slots=True)
class Tool:
    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    timeout_s: float = 10.0
    max_output_chars: int = 2000
    required: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not (self.timeout_s > 0):
            raise RpegError(f"tool {self.name!r}: timeout_s must be > 0, got {self.timeout_s!r}")
        if type(self.max_output_chars) is not int or self.max_output_chars < 1:
            raise RpegError(f"tool {self.name!r}: max_output_chars must be a positive integer, "
                            f"got {self.max_output_chars!r}")

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema chat templates read (`apply_chat_template(tools=[...])`)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def tool(fn: Callable | None = None, *, name: str | None = None, timeout_s: float = 10.0,
         max_output_chars: int = 2000):
    """`@tool` or `@tool(timeout_s=..., max_output_chars=...)`: the function as a `Tool`."""
    def wrap(f: Callable) -> Tool:
        params, required = schema_of(f)
        description, _ = _docstring(f)
        return Tool(f, name or f.__name__, description, params, timeout_s, max_output_chars, tuple(required))

    return wrap(fn) if fn is not None else wrap


def _docstring(fn: Callable) -> tuple[str, dict[str, str]]:
    """(first paragraph, {parameter: description}) from a Google-style docstring."""
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    args: dict[str, str] = {}
    block = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.M)
    if block:
        current = None
        for line in block.group(1).splitlines():
            m = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
            if m and (current is None or len(line) - len(line.lstrip()) <= 4):
                current = m.group(1)
                args[current] = m.group(2).strip()
            elif current:
                args[current] = (args[current] + " " + line.strip()).strip()
    return description, args


def _json_type(hint: Any, where: str) -> dict[str, Any]:
    if hint in JSON_TYPES:
        return {"type": JSON_TYPES[hint]}
    origin = get_origin(hint)
    if origin is Literal:
        values = get_args(hint)
        return {"type": JSON_TYPES.get(type(values[0]), "string"), "enum": list(values)}
    if origin in (list, tuple, typing.List, typing.Sequence) or hint in (list, tuple):  # noqa: UP006
        items = get_args(hint)
        return {"type": "array", **({"items": _json_type(items[0], where)} if items else {})}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return _json_type(inner[0], where)
    if hint is dict or origin is dict:
        return {"type": "object"}
    raise RpegError(f"{where}: type {hint!r} has no JSON schema here (use str, int, float, bool, list[...], "
                    f"Literal[...], dict or X | None)")


def schema_of(fn: Callable) -> tuple[dict[str, Any], list[str]]:
    """(the JSON schema of `fn`'s arguments, the names it requires)."""
    if not callable(fn):
        raise RpegError(f"a tool must be a function, got {fn!r:.80}")
    hints = typing.get_type_hints(fn)
    _, docs = _docstring(fn)
    props: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        where = f"tool {fn.__name__!r}, parameter {p.name!r}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise RpegError(f"{where}: *args and **kwargs have no schema; name each parameter")
        if p.name not in hints:
            raise RpegError(f"{where}: needs a type hint (its JSON schema comes from it)")
        described = {"description": docs[p.name]} if p.name in docs else {}
        props[p.name] = {**_json_type(hints[p.name], where), **described}
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "object", "properties": props, "required": required}, required


def check_arguments(t: Tool, arguments: dict[str, Any]) -> str | None:
    """Why `arguments` do not fit `t`'s schema, or None when they do (JSON types, not Python's)."""
    if not isinstance(arguments, dict):
        return f"arguments must be an object, got {type(arguments).__name__}"
    props = t.parameters["properties"]
    missing = [k for k in t.required if k not in arguments]
    if missing:
        return f"missing argument {missing[0]!r}"
    for k, v in arguments.items():
        if k not in props:
            return f"unknown argument {k!r} (known: {', '.join(props) or 'none'})"
        want = props[k].get("type")
        ok = {"string": isinstance(v, str), "integer": isinstance(v, int) and not isinstance(v, bool),
              "number": isinstance(v, (int, float)) and not isinstance(v, bool), "boolean": isinstance(v, bool),
              "array": isinstance(v, list), "object": isinstance(v, dict)}.get(want, True)
        if not ok:
            return f"argument {k!r} must be {want}, got {type(v).__name__}"
        if "enum" in props[k] and v not in props[k]["enum"]:
            return f"argument {k!r} must be one of {props[k]['enum']}, got {v!r}"
    return None


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters cut]"


async def call(t: Tool, arguments: dict[str, Any], pool: Executor | None = None) -> tuple[str, bool]:
    """Run `t(**arguments)` off the event loop (an `async def` tool on it): (the observation text, whether
    the call succeeded)."""
    problem = check_arguments(t, arguments)
    if problem:
        return f"error: {t.name}: {problem}", False
    loop = asyncio.get_running_loop()
    # an `async def` tool (a remote service) waits on the event loop and holds no thread; a plain one runs on `pool`
    running = (t.fn(**arguments) if inspect.iscoroutinefunction(t.fn) else
               loop.run_in_executor(pool, lambda: t.fn(**arguments)))
    try:
        out = await asyncio.wait_for(running, t.timeout_s)
    except TimeoutError:
        return f"error: {t.name} timed out after {t.timeout_s:g} s", False
    except Exception as e:  # the tool's own failure is the model's observation, not the run's crash
        return _truncate(f"error: {t.name}: {type(e).__name__}: {e}", max(t.max_output_chars, ERROR_CHARS)), False
    return _truncate(out if isinstance(out, str) else str(out), t.max_output_chars), True
