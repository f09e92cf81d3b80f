"""How an episode's messages become text, and how a reply names its tool calls.

A `ChatFormat` renders only what the model did not sample: the opening (`opening`: the problem's
messages up to where the model's first reply begins) and each observation (`observation`: the tool
or environment messages after a reply, up to where the next reply begins). Earlier turns are never
rendered again: the episode keeps the sampled token ids verbatim and appends the observation's ids
(token-in/token-out, see episode.py), so what the trainer scores is exactly what the engine sampled.

Two formats:
- `PlainFormat`, for the tiny character-level model: the user's text as it is, a call written
  `name(arguments)` anywhere in a reply, and each observation as `"\\n> " + text + "\\n"`.
- `TemplateFormat`, for an instruct model: its tokenizer's chat template with the tools' JSON
  schemas (`apply_chat_template(tools=...)`), and Qwen/Hermes-style calls,
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. The observation's text is the
  template's rendering of the conversation with the tool messages minus its rendering without them,
  the way verl's and SkyRL's agent loops take it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from rpeg.errors import RpegError
from rpeg.tasks.tools import Tool

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    error: str | None = None  # why the call could not be read (the model's observation says so)


class ChatFormat(Protocol):
    def opening(self, messages: list[Message], tools: tuple[Tool, ...]) -> str: ...

    def observation(self, messages: list[Message]) -> str: ...

    def tool_calls(self, reply: str, tools: tuple[Tool, ...]) -> list[ToolCall]: ...

    def call(self, name: str, arguments: dict[str, Any]) -> str: ...


@dataclass(frozen=True, slots=True)
class PlainFormat:
    """The tiny model's format (its vocabulary has no quotes or angle brackets)."""

    prefix: str = "\n> "
    suffix: str = "\n"

    def opening(self, messages: list[Message], tools: tuple[Tool, ...]) -> str:
        return "".join(str(m["content"]) for m in messages if m.get("role") != "system")

    def observation(self, messages: list[Message]) -> str:
        return "".join(f"{self.prefix}{m['content']}{self.suffix}" for m in messages)

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """A call as a reply writes it (a demonstration's): `name(a, b)`, the arguments by position."""
        return f"{name}({', '.join(str(v) for v in arguments.values())})"

    def tool_calls(self, reply: str, tools: tuple[Tool, ...]) -> list[ToolCall]:
        """`name(a)` or `name(a, b)` for a known tool: arguments by position, as text (a parameter
        typed int or float is converted; one that will not convert is reported as the call's error)."""
        calls = []
        for t in tools:
            for m in re.finditer(rf"\b{re.escape(t.name)}\(([^()]*(?:\([^()]*\)[^()]*)*)\)", reply):
                calls.append((m.start(), _positional(t, m.group(1))))
        return [c for _, c in sorted(calls, key=lambda sc: sc[0])]


def _positional(t: Tool, text: str) -> ToolCall:
    names = list(t.parameters["properties"])
    values = [text] if len(names) <= 1 else [v.strip() for v in text.split(",")]
    if len(values) > len(names):
        return ToolCall(t.name, {}, f"{t.name} takes {len(names)} argument(s), got {len(values)}")
    args: dict[str, Any] = {}
    for name, value in zip(names, values):
        kind = t.parameters["properties"][name].get("type")
        try:
            args[name] = int(value) if kind == "integer" else float(value) if kind == "number" else value
        except ValueError:
            return ToolCall(t.name, {}, f"argument {name!r} must be {kind}, got {value!r}")
    return ToolCall(t.name, args)


TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass(frozen=True)
class TemplateFormat:
    """An instruct model's own chat template (Hugging Face tokenizer with `apply_chat_template`)."""

    tokenizer: Any

    def __post_init__(self) -> None:
        if not getattr(self.tokenizer, "chat_template", None):
            raise RpegError("the model's tokenizer has no chat template (tokenizer_config.json or "
                            "chat_template.jinja); give its episodes as plain text (PlainFormat; in a run, "
                            "runtime.chat: false)")

    def _render(self, messages: list[Message], tools: tuple[Tool, ...] = ()) -> str:
        schemas = [t.schema for t in tools] or None
        return self.tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False,
                                                  add_generation_prompt=True)

    def opening(self, messages: list[Message], tools: tuple[Tool, ...]) -> str:
        """The opening; a template that ignores `tools=` (SmolLM2's) gets them in a system message of
        their own (`instructions`), first, or before the given system message's text."""
        if tools and not self.renders_tools(tools):
            rest = [m for m in messages if m.get("role") != "system"]
            system = "\n\n".join([self.instructions(tools)] + [str(m["content"]) for m in messages
                                                                if m.get("role") == "system"])
            messages = [{"role": "system", "content": system}] + rest
        return self._render(messages, tools)

    def renders_tools(self, tools: tuple[Tool, ...]) -> bool:
        """Whether the template writes the tools' schemas into the prompt (Qwen's does; SmolLM2's does not)."""
        probe = [{"role": "user", "content": "x"}]
        return self._render(probe, tools) != self._render(probe)

    def instructions(self, tools: tuple[Tool, ...]) -> str:
        """How to call `tools`, for a template that does not say it: their schemas and the call format."""
        schemas = "\n".join(json.dumps(t.schema) for t in tools)
        return ("You may call these tools. To call one, reply with only "
                '<tool_call>{"name": <tool name>, "arguments": {<its arguments>}}</tool_call>; its result comes '
                f"back in the next message. Tools:\n{schemas}")

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """A call as a reply writes it (a demonstration's): Qwen's and Hermes' `<tool_call>` JSON."""
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    def observation(self, messages: list[Message]) -> str:
        # Rendered after a stand-in conversation, then cut off it: the text a template puts between
        # an assistant turn's end and the next assistant turn's start, whatever the model said.
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        before = self.tokenizer.apply_chat_template(base, tokenize=False, add_generation_prompt=False)
        after = self._render(base + list(messages))
        if not after.startswith(before):
            raise RpegError("the chat template renders a conversation differently once a tool message follows "
                            "(it is not append-only), so an observation cannot be appended as tokens")
        return after[len(before):]

    def tool_calls(self, reply: str, tools: tuple[Tool, ...]) -> list[ToolCall]:
        known = {t.name for t in tools}
        calls = []
        for body in TOOL_CALL.findall(reply):
            try:
                obj = json.loads(body)
            except json.JSONDecodeError as e:
                calls.append(ToolCall("?", {}, f"the tool call is not JSON ({e.msg} at character {e.pos})"))
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                calls.append(ToolCall("?", {}, 'a tool call needs {"name": ..., "arguments": {...}}'))
            elif obj["name"] not in known:
                known_names = ", ".join(sorted(known))
                calls.append(ToolCall(obj["name"], {}, f"unknown tool {obj['name']!r} (known: {known_names})"))
            else:
                calls.append(ToolCall(obj["name"], obj.get("arguments") or {}))
        return calls
