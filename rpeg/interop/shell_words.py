"""Words of a launch script: the text cut into statements and words (quotes, brackets, comments,
redirections), the shell's expansion of `$X`, `${...}`, `$((...))` and `$(...)` against the variables the
script has set so far (`_Expansion`, the part of rpeg/interop/shell.py's reader that expands), the
evaluation of a test's words, and the placeholder a value the reader cannot know expands to.

rpeg/interop/shell.py runs the statements (variables, functions, if/else, wrappers); its docstring says
what the reader follows.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex

from rpeg.errors import RpegError

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_SEPARATORS = {";", "&&", "||", "|", "&", "|&"}


def unknown(name: str, why: str) -> str:
    """The placeholder a value the reader cannot know expands to (rpeg/interop/shell.py's docstring says when)."""
    return f"⟨unknown: ${name} {why}⟩"


def is_unknown(text: object) -> bool:
    return isinstance(text, str) and "⟨unknown: $" in text


class _Expansion:
    """The words and expansions of a reader whose state (the script's variables, arrays and positional
    parameters, and where it is) `_Shell` keeps."""

    where: str
    env: dict[str, str]
    arrays: dict[str, list[str]]
    positional: list[str]

    def words(self, text: str, lineno: int) -> list[str]:
        """`text` split into words as the shell would, after expansion."""
        try:
            return _split_words(text, lambda s, quoted: self.expand(s, lineno, quoted))
        except ValueError as e:
            raise RpegError(f"{self.where}: line {lineno}: cannot split {_short(text)!r} ({e})") from None

    def lookup(self, name: str, lineno: int) -> str | None:
        if name.isdigit():
            k = int(name)
            if k == 0:
                return self.where
            return self.positional[k - 1] if k <= len(self.positional) else None
        if name == "#":
            return str(len(self.positional))
        return self.env.get(name)

    def expand(self, text: str, lineno: int, quoted: bool) -> str:
        """Parameter, arithmetic and command expansion of one piece of a word."""
        out, i = [], 0
        while i < len(text):
            c = text[i]
            if c != "$" and c != "`":
                out.append(c)
                i += 1
                continue
            if c == "`":
                j = text.find("`", i + 1)
                j = len(text) - 1 if j < 0 else j
                out.append(unknown("(`...`)", "is the output of a command this reader does not run"))
                i = j + 1
                continue
            if text.startswith("$((", i):
                j = _close(text, i + 1, "(", ")")
                out.append(self.arith(self.expand(text[i + 3:j - 1], lineno, True), lineno))
                i = j + 1
                continue
            if text.startswith("$(", i):
                j = _close(text, i + 1, "(", ")")
                out.append(unknown(f"({_short(text[i + 2:j], 30)})", "is the output of a command this reader does "
                                   "not run"))
                i = j + 1
                continue
            if text.startswith("${", i):
                j = _close(text, i + 1, "{", "}")
                out.append(self.brace(text[i + 2:j], lineno))
                i = j + 1
                continue
            m = re.match(rf"{_NAME}|[0-9#@*?$!]", text[i + 1:])
            if not m:
                out.append(c)
                i += 1
                continue
            name = m.group(0)
            i += 1 + len(name)
            if name in "@*":
                out.append(" ".join(shlex.quote(p) for p in self.positional) if not quoted else " ".join(
                    self.positional))
            elif name in "?$!":
                out.append("0")
            else:
                out.append(self.value(name, lineno))
        return "".join(out)

    def value(self, name: str, lineno: int) -> str:
        v = self.lookup(name, lineno)
        if v is None:
            if name.isdigit():
                return ""  # a positional parameter the script is not given
            return unknown(name, "is never set in the script (an environment variable of the run)")
        return v

    def brace(self, body: str, lineno: int) -> str:
        m = re.fullmatch(rf"({_NAME})\[([@*])\]", body)
        if m:
            return " ".join(shlex.quote(w) for w in self.arrays.get(m.group(1), []))
        m = re.fullmatch(rf"#({_NAME})\[[@*]\]", body)
        if m:
            return str(len(self.arrays.get(m.group(1), [])))
        m = re.fullmatch(rf"({_NAME})\[(\d+)\]", body)
        if m:
            arr = self.arrays.get(m.group(1), [])
            k = int(m.group(2))
            return arr[k] if k < len(arr) else ""
        m = re.fullmatch(rf"#({_NAME}|\d+)", body)
        if m:
            v = self.lookup(m.group(1), lineno)
            return str(len(v or "")) if not is_unknown(v) else unknown(m.group(1), "has a length this reader "
                                                                                      "cannot know")
        m = re.fullmatch(rf"({_NAME}|\d+)(?:(:?[-=+?])(.*))?", body, re.S)
        if m:
            name, op, arg = m.groups()
            v = self.lookup(name, lineno)
            if op is None:
                return self.value(name, lineno)
            empty = v is None or (op.startswith(":") and v == "")
            if op.endswith("-") or op.endswith("?"):
                return self.expand(_unquote(arg), lineno, True) if empty else v
            if op.endswith("="):
                if empty:
                    v = self.expand(_unquote(arg), lineno, True)
                    self.env[name] = v
                return v
            return "" if empty else self.expand(_unquote(arg), lineno, True)  # :+
        m = re.fullmatch(rf"({_NAME})(//?)([^/]*)/?(.*)", body, re.S)
        if m:
            name, op, pat, rep = m.groups()
            v = self.value(name, lineno)
            if is_unknown(v) or any(ch in pat for ch in "*?["):
                return v if is_unknown(v) else unknown(name, f"is rewritten by a pattern ({body}) this reader does "
                                                             "not follow")
            return v.replace(pat, rep) if op == "//" else v.replace(pat, rep, 1)
        name = re.match(_NAME, body)
        return unknown(name.group(0) if name else body, f"is expanded as ${{{body}}}, which this reader does not "
                                                         "follow")

    def arith(self, expr: str, lineno: int) -> str:
        if is_unknown(expr):
            return re.search(r"⟨unknown: [^⟩]*⟩", expr).group(0)
        return _arith(expr, {**self.env, **{str(k + 1): p for k, p in enumerate(self.positional)}},
                      f"{self.where}: line {lineno}")


def _evaluate(words: list[str]) -> bool | None:
    """A test's words (already expanded): && || -a -o ! and the string and number comparisons."""
    for sep in ("||", "-o"):
        if sep in words:
            k = words.index(sep)
            a, b = _evaluate(words[:k]), _evaluate(words[k + 1:])
            return True if (a or b) else None if a is None or b is None else False
    for sep in ("&&", "-a"):
        if sep in words:
            k = words.index(sep)
            a, b = _evaluate(words[:k]), _evaluate(words[k + 1:])
            return False if (a is False or b is False) else None if a is None or b is None else True
    if words and words[0] == "!":
        v = _evaluate(words[1:])
        return None if v is None else not v
    if any(is_unknown(w) for w in words):
        return None
    if len(words) == 1:
        return words[0] != ""
    if len(words) == 2 and words[0] in ("-z", "-n"):
        return (words[1] == "") == (words[0] == "-z")
    if len(words) == 3:
        a, op, b = words
        if op in ("=", "=="):
            return a == b if not any(ch in b for ch in "*?[") else None
        if op == "!=":
            return a != b if not any(ch in b for ch in "*?[") else None
        nums = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le, "-gt": operator.gt,
                "-ge": operator.ge}
        if op in nums:
            try:
                return nums[op](int(a), int(b))
            except ValueError:
                return None
    return None  # file tests (-d, -f, -e, ...) and the rest: the file system at run time


def _skip(text: str, i: int) -> int:
    """The index just past the quoted string, $( ), $(( )), ${ }, `...` or ( ) that starts at text[i]
    (past the end of `text` when it is never closed)."""
    n = len(text)
    ch = text[i]
    if ch == "'":
        j = text.find("'", i + 1)
        return n + 1 if j < 0 else j + 1
    if ch == "`":
        j = i + 1
        while j < n and text[j] != "`":
            j += 2 if text[j] == "\\" else 1
        return n + 1 if j >= n else j + 1
    if ch == '"':
        j = i + 1
        while j < n:
            c = text[j]
            if c == "\\":
                j += 2
            elif c == '"':
                return j + 1
            elif text.startswith("$(", j) or text.startswith("${", j) or c == "`":
                j = _skip(text, j)
            else:
                j += 1
        return n + 1
    if text.startswith("${", i):
        opener, closer, j = "{", "}", i + 2
    elif text.startswith("$(", i):
        opener, closer, j = "(", ")", i + 2
    else:
        opener, closer, j = "(", ")", i + 1
    depth = 1
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c in "'\"`" or text.startswith("$(", j) or text.startswith("${", j):
            j = _skip(text, j)
            continue
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return n + 1


def _close(text: str, i: int, op: str, cl: str) -> int:
    """The index of the bracket closing the one at text[i] (i at the `$` of `$(` / `${`, or at `(`)."""
    start = i - 1 if i > 0 and text[i - 1] == "$" and text[i] in "({" else i
    return min(_skip(text, start), len(text)) - 1


def _split_statements(line: str) -> list[tuple[str, str]]:
    """A logical line cut at ; && || | & outside quotes and brackets; each piece with the separator after it."""
    out, buf, i = [], [], 0
    while i < len(line):
        ch = line[i]
        if ch == "\\" and i + 1 < len(line):
            buf.append(line[i:i + 2])
            i += 2
            continue
        if ch in "'\"`(" or line.startswith("$(", i) or line.startswith("${", i):
            j = min(_skip(line, i), len(line))
            buf.append(line[i:j])
            i = j
            continue
        two = line[i:i + 2]
        if two in ("&&", "||", "|&", ";;"):
            out.append(("".join(buf), two))
            buf = []
            i += 2
            continue
        if ch in ";|" or (ch == "&" and line[max(0, i - 1)] not in "<>" and not line.startswith("&>", i)):
            out.append(("".join(buf), ch))
            buf = []
            i += 1
            continue
        buf.append(ch)
        i += 1
    out.append(("".join(buf), ""))
    return out


def _split_words(text: str, expand) -> list[str]:
    """Words of one statement: quotes removed, `expand(piece, quoted)` applied to each unquoted or
    double-quoted piece, unquoted expansions split on blanks (the shell's word splitting)."""
    words: list[str] = []
    cur: list[str] = []
    has = False  # the current word exists (even empty: "")
    i = 0

    def flush():
        nonlocal cur, has
        if has or cur:
            words.append("".join(cur))
        cur, has = [], False

    while i < len(text):
        ch = text[i]
        if ch in " \t\n":
            flush()
            i += 1
            continue
        if ch == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise ValueError("no closing quotation")
            cur.append(text[i + 1:j])
            has = True
            i = j + 1
            continue
        if ch == "#" and not cur and not has:  # a comment (inside an array's parentheses, say)
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        m = re.match(rf'"(\$@|\$\{{@\}}|\$\{{{_NAME}\[@\]\}})"', text[i:])
        if m:  # "$@" and "${name[@]}": one word per element
            flush()
            try:
                words.extend(shlex.split(expand(m.group(1), False)))
            except ValueError:
                words.append(expand(m.group(1), True))
            i += len(m.group(0))
            continue
        if ch == '"':
            j, buf = i + 1, []
            while j < len(text) and text[j] != '"':
                if text[j] == "\\" and j + 1 < len(text) and text[j + 1] in '"\\$`\n':
                    if text[j + 1] != "\n":  # backslash-newline: a continuation, removed
                        buf.append(text[j + 1] if text[j + 1] != "$" else "\x00")
                    j += 2
                    continue
                if text.startswith("$(", j) or text.startswith("${", j):
                    k = _close(text, j + 1, text[j + 1], ")" if text[j + 1] == "(" else "}")
                    buf.append(text[j:k + 1])
                    j = k + 1
                    continue
                buf.append(text[j])
                j += 1
            if j >= len(text):
                raise ValueError("no closing quotation")
            cur.append(expand("".join(buf), True).replace("\x00", "$"))
            has = True
            i = j + 1
            continue
        if ch == "\\" and i + 1 < len(text):
            if text[i + 1] == "\n":  # a continuation
                flush()
            else:
                cur.append(text[i + 1])
                has = True
            i += 2
            continue
        if ch == "$" or ch == "`":
            if text.startswith("$((", i):
                j = _close(text, i + 1, "(", ")") + 1
            elif text.startswith("$(", i):
                j = _close(text, i + 1, "(", ")") + 1
            elif text.startswith("${", i):
                j = _close(text, i + 1, "{", "}") + 1
            elif ch == "`":
                j = text.find("`", i + 1) + 1 or len(text)
            else:
                m = re.match(rf"\$({_NAME}|[0-9#@*?$!])", text[i:])
                j = i + (len(m.group(0)) if m else 1)
            value = expand(text[i:j], False)
            if text[i:j] in ("$@", "$*", "${@}", "${*}") or text[i:j].endswith("[@]}"):
                try:
                    parts = shlex.split(value)
                except ValueError:
                    parts = _wsplit(value)
            else:
                parts = _wsplit(value)
            for k, p in enumerate(parts if value else []):
                if k:
                    flush()
                if p:
                    cur.append(p)
                    has = True
            if value and re.match(r"[ \t\n]", value[-1]):
                flush()
            i = j
            continue
        if ch in "<>" or (ch in "&0123456789" and re.match(r"(\d*|&)>>?|\d*<", text[i:]) and not cur):
            m = re.match(r"(?:\d*|&)(?:>>?|<<?<?)(?:&\d+|&-)?", text[i:])
            if m and m.group(0):
                flush()
                i += len(m.group(0))
                if not re.search(r"&\d*-?$", m.group(0)):  # a redirection's target: not a word of the command
                    while i < len(text) and text[i] in " \t":
                        i += 1
                    while i < len(text) and text[i] not in " \t\n":
                        i += 1
                continue
        cur.append(ch)
        has = True
        i += 1
    flush()
    return words


def _wsplit(value: str) -> list[str]:
    """Word splitting of an unquoted expansion: on blanks, but never inside a placeholder."""
    parts = re.findall(r"(?:⟨[^⟩]*⟩|[^ \t\n⟨])+", value)
    if value and value[0] in " \t\n":
        parts.insert(0, "")
    return parts


def _cut(words: list[str]) -> list[str]:
    """The command's own words (a separator word ends it)."""
    for k, w in enumerate(words):
        if w in _SEPARATORS:
            return words[:k]
    return words


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _arith(expr: str, env: dict[str, str], where: str) -> str:
    """Shell arithmetic `$(( ... ))` over whole numbers: names read from `env`."""
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Div: operator.floordiv, ast.Mod: operator.mod}
    text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*|\d+)\}?", r"\1", expr)
    text = re.sub(r"\b(\d+)\b(?=\s*[A-Za-z_])", r"\1", text)

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            value = env.get(node.id, "0")
            if is_unknown(value):
                raise _Unknown(value)
            try:
                return int(value) if value != "" else 0
            except ValueError:
                raise RpegError(f"{where}: $(({expr})): {node.id} = {value!r} is not a whole number") from None
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise RpegError(f"{where}: $(({expr})): only + - * / % of whole numbers are read")

    try:
        return str(ev(ast.parse(text.strip().replace("/", "//").replace("////", "//"), mode="eval")))
    except _Unknown as u:
        return u.value
    except SyntaxError:
        raise RpegError(f"{where}: $(({expr})) is not shell arithmetic this reader follows") from None


class _Unknown(Exception):
    def __init__(self, value: str):
        self.value = value
