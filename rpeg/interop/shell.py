"""Launch scripts as the peers write them: find the command that starts the trainer, with its words.

`script_command(text, entry, where)` runs a bash launch script as far as a reader can without a
shell: it follows variable assignments (`NAME=value`, `export`, `local`, `readonly`, `declare`,
`NAME+=value`, arrays), parameter expansion (`$X`, `${X}`, `${X:-default}`, `${X-d}`, `${X:=d}`,
`${X:+alt}`, `${X//from/to}`, `${X/from/to}`, `${#X}`, `${name[@]}`), arithmetic `$((...))`,
positional parameters (`${1:-8}`: the script is read as run with no arguments, so its defaults
hold), quotes over several lines, backslash continuations, comments, heredocs (their text is
skipped), `if` / `elif` / `else` whose tests compare strings or numbers (`[ ]`, `[[ ]]`, `test`),
functions (run when called, with their arguments), and SLURM's `#SBATCH` lines (the variables
SLURM sets from them: SLURM_JOB_NUM_NODES, SLURM_NNODES, SLURM_GPUS_PER_NODE, ...).

The trainer's command may sit behind wrappers: `srun ...`, `ray job submit ... --`, `bash -c
"..."` (the quoted script is read in turn), `nohup`, redirections and pipes.

What a reader cannot run is never guessed. A value made by a command (`$(hostname)`), a variable
assigned under a test it cannot decide (`[ -d DIR ]`, a command's exit status) or inside a loop,
and a variable the script reads but never sets (an environment variable) expand to a marked
placeholder such as `⟨unknown: $NODES is set under line 12: if [ -d /data ], which this reader cannot
decide⟩`,
so a key that needs the value is refused with that reason and a key that does not (a data path)
is not. A trainer command under such a test or inside a loop is refused, naming it.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from dataclasses import dataclass, field

from rpeg.errors import RpegError

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# SLURM's environment from #SBATCH options (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES")
_SBATCH = {"nodes": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"), "N": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
           "gpus-per-node": ("SLURM_GPUS_PER_NODE",), "cpus-per-task": ("SLURM_CPUS_PER_TASK",),
           "ntasks-per-node": ("SLURM_NTASKS_PER_NODE",), "ntasks": ("SLURM_NTASKS",)}
_KEYWORDS = {"if", "then", "elif", "else", "fi", "for", "while", "until", "do", "done", "case", "esac"}
_SEPARATORS = {";", "&&", "||", "|", "&", "|&"}


def unknown(name: str, why: str) -> str:
    """The placeholder a value the reader cannot know expands to (see the module docstring)."""
    return f"⟨unknown: ${name} {why}⟩"


def is_unknown(text: object) -> bool:
    return isinstance(text, str) and "⟨unknown: $" in text


@dataclass
class _Block:
    kind: str                # "if", "loop", "case", "func", "group"
    state: bool | None       # the branch now read: True run, False skip, None undecidable
    taken: bool = False      # an earlier branch of this if ran
    where: str = ""          # the test or loop, as written (for messages)
    lines: list = field(default_factory=list)  # a function's body
    name: str = ""
    depth: int = 0           # groups opened inside a function's body


class _Found(Exception):
    def __init__(self, words: list[str], entry: str):
        self.words, self.entry = words, entry


def script_command(text: str, entry: re.Pattern, where: str) -> tuple[list[str], str]:
    """The words after the word matching `entry` (e.g. a module name) in the command of a launch
    script that runs it, with the script's variables expanded; and the word matched."""
    shell = _Shell(where, entry, {"HOME": "~", **_sbatch(text)})
    try:
        shell.run(text, positional=[])
    except _Found as f:
        return f.words, f.entry
    seen = f"; it runs {', '.join(dict.fromkeys(shell.pythons))}" if shell.pythons else ""
    names = entry.pattern.strip("^$").strip("()").replace("\\.", ".").replace("|", ", ")
    raise RpegError(f"{where}: no command in it runs {names}{seen}")


def _sbatch(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for m in re.finditer(r"^#SBATCH\s+(?:--([a-z-]+)[= ]?|-([A-Za-z])\s*)(\S*)", text, re.M):
        opt, value = m.group(1) or m.group(2), m.group(3)
        if opt == "gres":
            g = re.match(r"gpu(?::[^:,]+)?:(\d+)$", value)
            if g:
                env.setdefault("SLURM_GPUS_ON_NODE", g.group(1))
                env.setdefault("SLURM_GPUS_PER_NODE", g.group(1))
            continue
        for var in _SBATCH.get(opt, ()):
            if re.fullmatch(r"\d+", value):
                env[var] = value
    return env


class _Shell:
    def __init__(self, where: str, entry: re.Pattern, env: dict[str, str]):
        self.where, self.entry, self.env = where, entry, env
        self.arrays: dict[str, list[str]] = {}
        self.functions: dict[str, list[tuple[int, str]]] = {}
        self.positional: list[str] = []
        self.depth = 0
        self.pythons: list[str] = []  # the Python programs the script runs, for a refusal to name

    # ---- reading the text into statements ------------------------------------------------------

    def statements(self, text: str) -> list[tuple[int, str]]:
        """(line number, text) of each logical line: quotes, $( ), ( ) and { } of expansions may span
        lines; backslash continuations joined; comments and heredoc bodies dropped."""
        out: list[tuple[int, str]] = []
        i, n, buf, lineno, start = 0, len(text), [], 1, 1
        heredocs: list[tuple[str, bool]] = []
        while i < n:
            ch = text[i]
            if ch == "\\" and i + 1 < n:
                if text[i + 1] == "\n":  # a continuation
                    buf.append(" ")
                    lineno += 1
                else:
                    buf.append(text[i:i + 2])
                i += 2
                continue
            if ch in "'\"" or text.startswith("$(", i) or text.startswith("${", i) or ch == "`" or \
                    (ch == "(" and (not buf or buf[-1] in " \t=(")):
                j = _skip(text, i)
                if j > n:
                    raise RpegError(f"{self.where}: line {lineno}: {_short(text[i:], 30)!r} is never closed")
                piece = text[i:j]
                buf.append(piece)
                lineno += piece.count("\n")
                i = j
                continue
            if ch == "#" and (not buf or buf[-1][-1:] in " \t;|&("):
                while i < n and text[i] != "\n":
                    i += 1
                continue
            if text.startswith("<<", i) and not text.startswith("<<<", i):
                m = re.match(r"<<(-?)\s*(['\"]?)([A-Za-z_0-9]+)\2", text[i:])
                if m:
                    heredocs.append((m.group(3), bool(m.group(1))))
            if ch == "\n":
                if "".join(buf).strip():
                    out.append((start, "".join(buf)))
                buf = []
                lineno += 1
                i += 1
                for word, dash in heredocs:  # skip each heredoc's body up to its word
                    while i < n:
                        end = text.find("\n", i)
                        end = n if end < 0 else end
                        body_line = text[i:end]
                        i = end + 1
                        lineno += 1
                        if (body_line.strip() if dash else body_line) == word:
                            break
                heredocs = []
                start = lineno
                continue
            buf.append(ch)
            i += 1
        if "".join(buf).strip():
            out.append((start, "".join(buf)))
        return out

    # ---- running --------------------------------------------------------------------------------

    def run(self, text: str, positional: list[str]) -> None:
        self.positional = positional
        self.block_stack: list[_Block] = []
        for lineno, line in self.statements(text):
            self.line(lineno, line)

    def line(self, lineno: int, line: str) -> None:
        for stmt, _sep in _split_statements(line):
            self.statement(lineno, stmt.strip())

    def certain(self) -> bool | None:
        """True: this statement runs; False: it does not; None: it may (an undecidable test or a loop)."""
        state: bool | None = True
        for b in self.block_stack:
            if b.state is False:
                return False
            if b.state is None:
                state = None
        return state

    def why_uncertain(self) -> str:
        b = next(b for b in reversed(self.block_stack) if b.state is None)
        return b.where

    def statement(self, lineno: int, stmt: str) -> None:
        if not stmt:
            return
        # a function being defined collects its body
        func = next((b for b in reversed(self.block_stack) if b.kind == "func"), None)
        first = stmt.split(None, 1)[0] if stmt.split() else ""
        if func is not None:
            opens = stmt == "{" or (stmt.endswith("{") and not stmt.endswith("${"))
            if stmt == "{" and not func.lines and not func.taken:
                func.taken = True  # the body's opening brace on a line of its own
                return
            if stmt.startswith("}"):
                if func.depth:  # a group inside the body closes
                    func.depth -= 1
                    func.lines.append((lineno, stmt))
                    return
                self.block_stack.pop()
                self.functions[func.name] = func.lines
                return
            if opens:
                func.depth += 1
            func.lines.append((lineno, stmt))
            return
        m = re.match(rf"(?:function\s+)?({_NAME})\s*\(\s*\)\s*\{{?\s*(.*)$", stmt) or \
            re.match(rf"function\s+({_NAME})\s*\{{?\s*(.*)$", stmt)
        if m:
            body = m.group(2).strip()
            blk = _Block("func", False, taken=stmt.rstrip().endswith("{"), name=m.group(1))
            self.block_stack.append(blk)
            if body and body != "}":
                if body.endswith("}"):
                    blk.lines.append((lineno, body[:-1].rstrip("; ")))
                    self.block_stack.pop()
                    self.functions[blk.name] = blk.lines
                else:
                    blk.lines.append((lineno, body))
            elif body == "}":
                self.block_stack.pop()
                self.functions[blk.name] = []
            return
        if first in ("if", "elif"):
            cond = stmt[len(first):].strip()
            cond = re.sub(r";?\s*then\s*$", "", cond)
            if first == "elif":
                blk = self.block_stack[-1] if self.block_stack and self.block_stack[-1].kind == "if" else None
                if blk is None:
                    raise RpegError(f"{self.where}: line {lineno}: elif outside an if")
                if blk.taken:
                    blk.state = False
                    return
                value = self.test(cond) if self.certain() is not False else False
                blk.state, blk.where = value, f"line {lineno}: elif {cond}"
                blk.taken = value is True
                return
            value = self.test(cond) if self.certain() is not False else False
            self.block_stack.append(_Block("if", value, taken=value is True, where=f"line {lineno}: if {cond}"))
            return
        if first == "then":
            rest = stmt[4:].strip()
            if rest:
                self.statement(lineno, rest)
            return
        if first == "else":
            blk = self.block_stack[-1] if self.block_stack else None
            if blk is None or blk.kind != "if":
                raise RpegError(f"{self.where}: line {lineno}: else outside an if")
            blk.state = None if blk.state is None and not blk.taken else (not blk.taken)
            rest = stmt[4:].strip()
            if rest:
                self.statement(lineno, rest)
            return
        if first == "fi":
            self.pop("if", lineno)
            return
        if first in ("for", "while", "until", "select"):
            self.block_stack.append(_Block("loop", None if self.certain() is not False else False,
                                           where=f"line {lineno}: {_short(stmt)}"))
            rest = re.split(r";\s*do\b", stmt, maxsplit=1)
            if len(rest) == 2 and rest[1].strip():
                self.statement(lineno, rest[1].strip())
            return
        if first == "do":
            rest = stmt[2:].strip()
            if rest:
                self.statement(lineno, rest)
            return
        if first == "done":
            self.pop("loop", lineno)
            return
        if first == "case":
            self.block_stack.append(_Block("case", None if self.certain() is not False else False,
                                           where=f"line {lineno}: {_short(stmt)}"))
            return
        if first == "esac":
            self.pop("case", lineno)
            return
        if stmt in ("{", "(") or stmt.startswith("{ "):
            self.block_stack.append(_Block("group", True))
            rest = stmt[1:].strip()
            if rest:
                self.statement(lineno, rest)
            return
        if stmt in ("}", ")") and self.block_stack and self.block_stack[-1].kind == "group":
            self.block_stack.pop()
            return
        state = self.certain()
        if state is False:
            return
        self.simple(lineno, stmt, state)

    def pop(self, kind: str, lineno: int) -> None:
        if not self.block_stack or self.block_stack[-1].kind != kind:
            raise RpegError(f"{self.where}: line {lineno}: a closing word without its opening {kind}")
        self.block_stack.pop()

    # ---- one simple command ---------------------------------------------------------------------

    def simple(self, lineno: int, stmt: str, state: bool | None) -> None:
        m = re.match(rf"(?:(?:export|local|readonly|declare(?:\s+-[a-zA-Z]+)*)\s+)?({_NAME})(\+?)=\((.*)\)\s*$",
                     stmt, re.S)
        if m:  # an array
            name, plus, body = m.groups()
            words = self.words(body, lineno)
            self.arrays[name] = (self.arrays.get(name, []) if plus else []) + words
            return
        words = self.words(stmt, lineno)
        if not words:
            return
        # the entry: anywhere in the command (after srun, ray job submit --, python3 -m, ...)
        for k, w in enumerate(words):
            if self.entry.search(w):
                if state is None:
                    raise RpegError(f"{self.where}: line {lineno}: the trainer's command runs under "
                                    f"{self.why_uncertain()}, which this reader cannot decide or run")
                raise _Found(_cut(words[k + 1:]), w)
        # a quoted script (bash -c "...", ssh host "...") that runs the entry: read it in turn
        for w in words:
            if ("\n" in w or " " in w) and self.entry.search(w.replace("\n", " ").replace("\t", " ")) is None \
                    and any(self.entry.search(t) for t in w.split()):
                inner = _Shell(self.where, self.entry, dict(self.env))
                inner.arrays, inner.functions = dict(self.arrays), dict(self.functions)
                inner.run(w, self.positional)
        for k, w in enumerate(words):
            if re.fullmatch(r"python[0-9.]*", w.rsplit("/", 1)[-1]) and k + 1 < len(words):
                rest = [x for x in words[k + 1:] if x != "-u"]
                if rest:
                    self.pythons.append(" ".join(rest[:2]) if rest[0] == "-m" and len(rest) > 1 else rest[0])
                break
        assigns = []
        while words and re.match(rf"({_NAME})(\+?)=(.*)$", words[0], re.S):
            assigns.append(words.pop(0))
        if words and words[0] in ("export", "local", "readonly", "declare", "typeset"):
            words = [w for w in words[1:] if not w.startswith("-")]
            assigns += [w for w in words if "=" in w]
            words = []
        if not words:  # assignments that stay in the script's environment
            for a in assigns:
                name, plus, value = re.match(rf"({_NAME})(\+?)=(.*)$", a, re.S).groups()
                if state is None:
                    value = unknown(name, f"is set under {self.why_uncertain()}, which this reader cannot decide")
                elif plus:
                    value = self.env.get(name, "") + value
                self.env[name] = value
            return
        cmd = words[0]
        if cmd == "shift":
            n = int(words[1]) if len(words) > 1 and words[1].isdigit() else 1
            self.positional = self.positional[n:]
        elif cmd == "unset":
            for w in words[1:]:
                self.env.pop(w, None)
        elif cmd in self.functions and state is not False and self.depth < 20:
            saved = self.positional, self.block_stack
            self.depth += 1
            self.positional, self.block_stack = words[1:], list(self.block_stack)
            for ln, line in self.functions[cmd]:
                self.line(ln, line)
            self.positional, self.block_stack = saved
            self.depth -= 1
        elif cmd == "read":  # read VAR ...: its value comes from input
            for w in words[1:]:
                if re.fullmatch(_NAME, w):
                    self.env[w] = unknown(w, "is read from input at run time")

    # ---- words and expansion --------------------------------------------------------------------

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

    # ---- tests ---------------------------------------------------------------------------------

    def test(self, cond: str) -> bool | None:
        """The value of an if's test, or None when this reader cannot decide it."""
        cond = cond.strip()
        m = re.fullmatch(r"\[\[(.*)\]\]", cond, re.S) or re.fullmatch(r"\[(.*)\]", cond, re.S) or \
            re.fullmatch(r"test\s(.*)", cond, re.S)
        if not m:
            if cond in ("true", ":"):
                return True
            if cond == "false":
                return False
            return None  # a command's exit status
        try:
            words = _split_words(m.group(1), lambda s, q: self.expand(s, 0, q))
        except ValueError:
            return None
        return _evaluate(words)


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
