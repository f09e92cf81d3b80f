"""Exact YAML/JSON round trip of the IR's frozen dataclasses, with typed, located errors.

`to_data` turns a value into plain dicts, lists and scalars (fields equal to their default are
left out, so files stay short); `from_data(cls, data)` checks every key and type against the
dataclass and says where a file went wrong: `job.response.max: expected int, got 'long'`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import stat
import types

from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from rpeg.errors import RpegError

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def to_data(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            if not f.init:  # derived on construction
                continue
            v = getattr(value, f.name)
            if f.default is not dataclasses.MISSING and v == f.default and type(v) is type(f.default):
                continue
            out[f.name] = to_data(v)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [to_data(v) for v in value]
    if isinstance(value, dict):
        return {k: to_data(v) for k, v in value.items()}
    return value


def from_data(tp: Any, data: Any, where: str = "") -> Any:
    """Build a value of type `tp` from plain data, raising RpegError that names the location."""
    origin = get_origin(tp)
    here = where or "<root>"
    if tp is Any:
        return data
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return from_data(a, data, where)
            except RpegError as e:
                errors.append(str(e))
        raise RpegError(errors[0] if len(errors) == 1 else f"{here}: {data!r} matches none of {tp}")
    if origin is Literal:
        if data not in get_args(tp):
            allowed = ", ".join(map(repr, get_args(tp)))
            raise RpegError(f"{here}: {data!r} is not one of {allowed}")
        return data
    if origin is dict:
        if not isinstance(data, dict):
            raise RpegError(f"{here}: expected a mapping, got {_show(data)}")
        kt, vt = get_args(tp) or (Any, Any)
        return {from_data(kt, k, f"{where}.{k}"): from_data(vt, v, f"{where}.{k}") for k, v in data.items()}
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(data, (list, tuple)):
            raise RpegError(f"{here}: expected a list, got {_show(data)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_data(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise RpegError(f"{here}: expected {len(args)} items, got {len(data)}")
        return tuple(from_data(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data)))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            allowed = ", ".join(m.value for m in tp)
            raise RpegError(f"{here}: {data!r} is not one of {allowed}") from None
    if dataclasses.is_dataclass(tp):
        return _dataclass_from(tp, data, where)
    if tp is bool:
        if not isinstance(data, bool):
            raise RpegError(f"{here}: expected true or false, got {_show(data)}")
        return data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            if isinstance(data, float) and data.is_integer():
                return int(data)
            raise RpegError(f"{here}: expected an integer, got {_show(data)}")
        return data
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise RpegError(f"{here}: expected a number, got {_show(data)}")
        try:
            return float(data)
        except OverflowError:
            raise RpegError(f"{here}: {_show(data)} is too large for a number") from None
    if tp is str:
        if not isinstance(data, str):
            raise RpegError(f"{here}: expected a string, got {_show(data)}")
        return data
    raise TypeError(f"serde: unsupported type {tp!r} at {here}")  # a bug in the IR, not user input


def _dataclass_from(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise RpegError(f"{where or '<root>'}: expected a mapping for {cls.__name__}, got {_show(data)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise RpegError(f"{_join(where, str(unknown[0]))}: unknown key for {cls.__name__} "
                        f"(known: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = from_data(hints[name], data[name], _join(where, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RpegError(f"{_join(where, name)}: missing (required by {cls.__name__})")
    try:
        return cls(**kwargs)
    except RpegError as e:
        named = not where or str(e).startswith(f"{where}:")  # the class's own message may name its place already
        raise RpegError(str(e) if named else f"{where}: {e}") from None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _show(data: Any) -> str:
    text = repr(data)
    return text if len(text) < 40 else text[:37] + "..."


# ---- files -------------------------------------------------------------------------------------
def dump_yaml(value: Any) -> str:
    return yaml.safe_dump(to_data(value), sort_keys=False, default_flow_style=None, width=100)


def dump_json(value: Any) -> str:
    return json.dumps(to_data(value), indent=1)


# Bounds on what a reader accepts. Job, cluster, device and validation files are a few kilobytes;
# these keep a wrong or hostile file from costing unbounded memory or time.
MAX_FILE_BYTES = 8 * 2**20  # the largest file read
MAX_DEPTH = 64  # nesting of mappings and lists
MAX_VALUES = 200_000  # values in the document, counting each use of a YAML alias (a "billion laughs" file
# of a few hundred bytes expands to billions)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (YAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # PyYAML reports an unhashable key itself
            if key in seen:
                mark = key_node.start_mark
                raise RpegError(f"{self.name}:{mark.line + 1}:{mark.column + 1}: key {_short(key)} given twice "
                                f"(first on line {seen[key] + 1})")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _json_pairs(source: str):
    def hook(pairs):
        out = dict(pairs)
        if len(out) < len(pairs):  # one pass over the keys, not one per key
            seen: set = set()
            dup = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise RpegError(f"{source}: key {_short(dup)} given twice in one object")
        return out

    return hook


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_shape(data: Any, source: str) -> Any:
    """Refuse documents nested deeper than MAX_DEPTH or holding more than MAX_VALUES values (each alias
    use counted); iterative, so a deep document cannot exhaust the stack here."""
    stack, count = [(data, 1)], 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise RpegError(f"{source}: more than {MAX_VALUES:,} values (repeated YAML aliases?); "
                            "job and cluster files are far smaller")
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise RpegError(f"{source}: nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                stack.append((v, depth + 1))
                if isinstance(value, dict):
                    stack.append((k, depth + 1))
    return data


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML or JSON; a syntax error becomes one line naming the place. Keys given twice, deeper
    nesting than MAX_DEPTH and more than MAX_VALUES values are refused.

    JSON text goes through `json` first: PyYAML reads YAML 1.1, where `1e-05` (how `json` writes
    small floats) is a string, not a number, so JSON is not quite YAML here.
    """
    if len(text) > MAX_FILE_BYTES:
        raise RpegError(f"{source}: {len(text):,} characters, more than the {MAX_FILE_BYTES:,} a file may hold")
    json_error = None
    try:
        if text.lstrip().startswith(("{", "[")):
            try:
                return _check_shape(json.loads(text, object_pairs_hook=_json_pairs(source)), source)
            except json.JSONDecodeError as e:
                json_error = e  # flow-style YAML, or broken JSON
            except ValueError as e:  # a number too long to convert
                raise RpegError(f"{source}: malformed JSON: {e}") from None
        loader = _Loader(text)
        loader.name = source
        try:
            return _check_shape(loader.get_single_data(), source)
        finally:
            loader.dispose()
    except RecursionError:
        raise RpegError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # PyYAML's int() of a number past Python's 4,300-digit limit
        raise RpegError(f"{source}: malformed YAML: {str(e).splitlines()[0][:120]}") from None
    except yaml.YAMLError as e:
        if json_error is not None:
            at = f":{json_error.lineno}:{json_error.colno}"
            raise RpegError(f"{source}{at}: malformed JSON: {json_error.msg}") from None
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RpegError(f"{source}{at}: malformed YAML: {problem}") from None


def read_yaml_file(path: str) -> Any:
    """A job, cluster, device or validation file: a regular file of at most MAX_FILE_BYTES of UTF-8."""
    try:
        info = os.stat(path)  # before open(): opening a FIFO would wait for a writer
        if not stat.S_ISREG(info.st_mode):
            raise RpegError(f"cannot read {path}: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise RpegError(f"cannot read {path}: {info.st_size:,} bytes, more than the {MAX_FILE_BYTES:,} "
                            "a job, cluster or validation file may hold")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise RpegError(f"cannot read {path}: {e.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:  # grew while we read it
        raise RpegError(f"cannot read {path}: more than {MAX_FILE_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RpegError(f"cannot read {path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    return parse_yaml(text, path)


__all__ = ["to_data", "from_data", "dump_yaml", "dump_json", "parse_yaml", "read_yaml_file"]
