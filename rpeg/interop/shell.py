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

The words of each statement and their expansion are rpeg/interop/shell_words.py's; this module runs
the statements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rpeg.errors import RpegError
from rpeg.interop.shell_words import (  # noqa: F401 (unknown, is_unknown: the importers and the tests read them here)
    _NAME, _Expansion, _cut, _evaluate, _short, _skip, _split_statements, _split_words, is_unknown, unknown,
)

# SLURM's environment from #SBATCH options (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES")
_SBATCH = {"nodes": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"), "N": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
           "gpus-per-node": ("SLURM_GPUS_PER_NODE",), "cpus-per-task": ("SLURM_CPUS_PER_TASK",),
           "ntasks-per-node": ("SLURM_NTASKS_PER_NODE",), "ntasks": ("SLURM_NTASKS",)}
_KEYWORDS = {"if", "then", "elif", "else", "fi", "for", "while", "until", "do", "done", "case", "esac"}


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
class _Shell(_Expansion):
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
