"""Enough bash to read a launch script without running it: what each command's words would be.

Launch scripts set degrees through variables (``TP=8``), arrays whose quoted elements hold a flag
and its value (``ARGS=("--fp8-format hybrid")``, split again when expanded unquoted), strings
expanded unquoted (``$OPTIONS``), ``$(( ))`` arithmetic, ``${X:-d}`` defaults and ``if``/``case``
on values set earlier. This evaluates them top to bottom as bash would (bash(1): "Parameter
Expansion", "Word Splitting", "Arithmetic Evaluation", "Compound Commands"), without running any
command: a command substitution, an unset scheduler variable (``SLURM_NNODES``) or a value read
at run time is *unknown*; a condition on an unknown value runs every branch as "unknown", and a
variable the branches set differently is unknown afterwards (reported in ``notes``, not guessed).
Heredoc bodies are skipped; ``bash -c STRING`` and ``eval STRING`` are read as scripts, and a file
next to the script that it ``source``s is read in place (``pwd`` is taken as the script's folder).
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from placer.check.shell_arith import arithmetic

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN_RE = re.compile(rf"^({_NAME})(\[[^\]]*\])?(\+?)=(.*)$", re.S)
_ARRAY_START_RE = re.compile(rf"^({_NAME})(\+?)=$")
_META = set(" \t\n;&|()<>")
_DECLARE = ("export", "local", "declare", "readonly", "typeset")
_RESERVED_END = {"then", "elif", "else", "fi", "do", "done", "esac", "}", ")", ";;", ";&", ";;&"}
_MAX_LOOP_ITEMS = 64
_MAX_DEPTH = 16
# commands evaluated per script, loops and branches included: past this it is not a launch script
_MAX_STEPS = 100_000
_MAX_SOURCED = 16  # files read through `source` per script
_MAX_SOURCED_BYTES = 1 << 20
UNKNOWN_MARK = "\x00"  # a part of a string known only at run time (bash strings hold no NUL)


class ShellSyntaxError(ValueError):
    """A construct this reader does not follow (the caller reports it as unreadable)."""


@dataclass(frozen=True)
class Unknown:
    """A value only known when the script runs; ``why`` says what it depends on."""

    why: str


@dataclass(frozen=True)
class Scalar:
    text: str
    line: int
    end_line: int


@dataclass(frozen=True)
class Array:
    items: tuple[tuple[str, int], ...]  # (element, line it is written on)


Value = Scalar | Array | Unknown


@dataclass(frozen=True)
class Word:
    """One word of one command after expansion (``text`` None: not known without running it).

    ``line`` is where the word's text is written (an array element's or an assignment's line
    for words that come from a variable); ``command`` is the command's first word;
    ``conditional`` is the line of the unknown ``if``/``case``/loop it sits in, or None.
    """

    text: str | None
    raw: str
    line: int
    command: str | None
    conditional: int | None = None


@dataclass
class Script:
    """What evaluating a script gives: command words in order, final variables, notes."""

    words: list[Word] = field(default_factory=list)
    variables: dict[str, Value] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    exported: list[str] = field(default_factory=list)
    """Names an ``export`` reaches (``export NAME=value`` or ``export NAME``), in order: what
    the commands it starts see in their environment besides what it was started with."""

    def value(self, name: str) -> str | None:
        """A variable's final text, None if unset or unknown."""
        item = self.variables.get(name)
        return _known(item.text) if isinstance(item, Scalar) else None


# ----- lexing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tok:
    kind: str  # word, array, op, nl, redir
    text: str
    line: int
    items: tuple[tuple[str, int], ...] = ()
    end: int = 0  # line the token ends on (continuations included)


class _Lexer:
    def __init__(self, text: str, first_line: int = 1) -> None:
        self.s, self.i, self.line = text, 0, first_line
        self.heredocs: list[tuple[str, bool]] = []
        self.out: list[_Tok] = []
        self.in_test = False

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def run(self) -> list[_Tok]:
        while self.i < len(self.s):
            c = self.peek()
            if c in " \t":
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c == "\n":
                self.out.append(_Tok("nl", "\n", self.line))
                self.i += 1
                self.line += 1
                self._skip_heredocs()
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            elif self.in_test:
                self._test_word()
            elif c in ";&|()":
                self._operator()
            elif c in "<>":
                self._redirect()
            else:
                self._word_or_array()
                last = self.out[-1] if self.out else None
                self.in_test = last is not None and last.kind == "word" and last.text == "[["
        return self.out

    def _test_word(self) -> None:
        """Inside ``[[ ... ]]``: && || ( ) < > are words of the test and newlines are blanks."""
        line = self.line
        if self.s.startswith("]]", self.i) and self.peek(2) in ("", " ", "\t", "\n", ";", "&",
                                                                 "|", ")"):
            self.i += 2
            self.in_test = False
            self.out.append(_Tok("word", "]]", line, end=line))
            return
        if self.peek() == "\n":
            self.i += 1
            self.line += 1
            return
        for op in ("&&", "||", "(", ")", "<", ">", "!"):
            if self.s.startswith(op, self.i):
                self.i += len(op)
                self.out.append(_Tok("word", op, line, end=line))
                return
        raw = self._word()
        if not raw:
            raise ShellSyntaxError(f"line {line}: unexpected {self.peek()!r} in [[ ]]")
        self.out.append(_Tok("word", raw, line, end=self.line))

    def _operator(self) -> None:
        for op in (";;&", ";;", ";&", "&&", "||", "|&", "&>>", "&>", ";", "&", "|", "(", ")"):
            if self.s.startswith(op, self.i):
                self.i += len(op)
                if op.startswith("&>"):
                    self.out.append(_Tok("redir", op, self.line))
                else:
                    self.out.append(_Tok("op", op, self.line))
                return

    def _redirect(self) -> None:
        for op in ("<<<", "<<-", "<<", ">>", ">&", "<&", "<>", ">|", ">", "<"):
            if self.s.startswith(op, self.i):
                self.i += len(op)
                if op in ("<<", "<<-"):
                    while self.peek() in (" ", "\t"):
                        self.i += 1
                    raw = self._word()
                    self.heredocs.append((re.sub(r"[\"'\\]", "", raw), op == "<<-"))
                else:
                    self.out.append(_Tok("redir", op, self.line))
                return

    def _skip_heredocs(self) -> None:
        while self.heredocs:
            delimiter, strip = self.heredocs.pop(0)
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                body = self.s[self.i:end]
                self.i = min(end + 1, len(self.s))
                self.line += 1
                if (body.lstrip("\t") if strip else body) == delimiter:
                    break

    def _word_or_array(self) -> None:
        line = self.line
        raw = self._word()
        match = _ARRAY_START_RE.match(raw)
        if match and self.peek() == "(":
            self.i += 1
            items = self._array_items()
            self.out.append(_Tok("array", raw, line, items))
            return
        if raw and raw.isdigit() and self.peek() in ("<", ">"):
            self._redirect()  # 2>&1, 1>file: the descriptor belongs to the redirection
            return
        if raw:
            self.out.append(_Tok("word", raw, line, end=self.line))
        elif self.i < len(self.s):
            raise ShellSyntaxError(f"line {line}: unexpected {self.peek()!r}")

    def _array_items(self) -> tuple[tuple[str, int], ...]:
        items: list[tuple[str, int]] = []
        while True:
            c = self.peek()
            if not c:
                raise ShellSyntaxError(f"line {self.line}: array left open at the end")
            if c in " \t":
                self.i += 1
            elif c == "\n":
                self.i += 1
                self.line += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c == "#":
                while self.peek() not in ("\n", ""):
                    self.i += 1
            elif c == ")":
                self.i += 1
                return tuple(items)
            else:
                line = self.line
                raw = self._word()
                if not raw:
                    raise ShellSyntaxError(f"line {line}: unexpected {self.peek()!r} in array")
                items.append((raw, line))

    def _word(self) -> str:
        start = self.i
        while self.i < len(self.s):
            c = self.peek()
            if c in _META:
                if c == "(" and _ARRAY_START_RE.match(self.s[start:self.i]):
                    break
                if c == "(" and self.s[start:self.i].endswith(("@", "?", "*", "+", "!")):
                    self._balanced("(", ")")  # extglob @(a|b)
                    continue
                break
            if c == "\\":
                if self.peek(1) == "\n":
                    self.s = self.s[:self.i] + self.s[self.i + 2:]
                    self.line += 1
                    continue
                self.i += 2
            elif c == "'":
                self._until("'")
            elif c == '"':
                self._double_quoted()
            elif c == "`":
                self._until("`", escapes=True)
            elif c == "$" and self.peek(1) == "(":
                self.i += 1
                self._balanced("(", ")")
            elif c == "$" and self.peek(1) == "{":
                self.i += 1
                self._balanced("{", "}")
            else:
                self.i += 1
        return self.s[start:self.i]

    def _until(self, close: str, escapes: bool = False) -> None:
        self.i += 1
        while self.i < len(self.s) and self.peek() != close:
            if escapes and self.peek() == "\\":
                self.i += 1
            if self.peek() == "\n":
                self.line += 1
            self.i += 1
        if self.i >= len(self.s):
            raise ShellSyntaxError(f"line {self.line}: unterminated {close}")
        self.i += 1

    def _double_quoted(self) -> None:
        self.i += 1
        while self.i < len(self.s):
            c = self.peek()
            if c == '"':
                self.i += 1
                return
            if c == "\\":
                if self.peek(1) == "\n":
                    self.s = self.s[:self.i] + self.s[self.i + 2:]
                    self.line += 1
                    continue
                self.i += 2
            elif c == "$" and self.peek(1) in ("(", "{"):
                self.i += 1
                self._balanced(self.peek(), ")" if self.peek() == "(" else "}")
            elif c == "`":
                self._until("`", escapes=True)
            else:
                if c == "\n":
                    self.line += 1
                self.i += 1
        raise ShellSyntaxError(f"line {self.line}: unterminated double quote")

    def _balanced(self, open_: str, close: str) -> None:
        depth = 0
        while self.i < len(self.s):
            c = self.peek()
            if c == "\\":
                self.i += 2
                continue
            if c == "'" and open_ == "(":
                self._until("'")
                continue
            if c == '"':
                self._double_quoted()
                continue
            if c == "\n":
                self.line += 1
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return
            self.i += 1
        raise ShellSyntaxError(f"line {self.line}: unterminated {open_}")


# ----- parsing ---------------------------------------------------------------------------------


@dataclass
class _Simple:
    line: int
    assigns: list[_Tok] = field(default_factory=list)
    words: list[_Tok] = field(default_factory=list)


@dataclass
class _If:
    line: int
    clauses: list[tuple[list[object], list[object]]]
    otherwise: list[object] | None


@dataclass
class _Case:
    line: int
    word: _Tok
    items: list[tuple[list[_Tok], list[object]]]


@dataclass
class _Loop:
    line: int
    kind: str  # for, while, until
    var: str | None
    items: list[_Tok] | None
    cond: list[object]
    body: list[object]


@dataclass
class _Group:
    line: int
    body: list[object]


@dataclass
class _Func:
    line: int
    name: str
    body: list[object]


@dataclass
class _Pipeline:
    negate: bool
    commands: list[object]


@dataclass
class _AndOr:
    first: _Pipeline
    rest: list[tuple[str, _Pipeline]]


class _Parser:
    def __init__(self, toks: list[_Tok]) -> None:
        self.t, self.i = toks, 0

    def peek(self) -> _Tok | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def kind(self) -> str | None:
        tok = self.peek()
        return tok.kind if tok is not None else None

    def is_word(self, *texts: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "word" and tok.text in texts

    def is_op(self, *texts: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "op" and tok.text in texts

    def take(self) -> _Tok:
        tok = self.peek()
        if tok is None:
            raise ShellSyntaxError("unexpected end of script")
        self.i += 1
        return tok

    def expect_word(self, text: str) -> None:
        tok = self.take()
        if tok.kind != "word" or tok.text != text:
            raise ShellSyntaxError(f"line {tok.line}: expected {text!r}, found {tok.text!r}")

    def skip_newlines(self) -> None:
        while self.kind() == "nl" or self.is_op(";"):
            self.i += 1

    def at_end(self, stops: set[str]) -> bool:
        tok = self.peek()
        if tok is None:
            return True
        return tok.text in stops and tok.kind in ("word", "op")

    def parse_list(self, stops: set[str] | None = None) -> list[object]:
        stops = stops if stops is not None else set()
        items: list[object] = []
        while True:
            self.skip_newlines()
            if self.at_end(stops):
                return items
            items.append(self.and_or())
            if self.is_op("&"):
                self.i += 1

    def and_or(self) -> _AndOr:
        first = self.pipeline()
        rest: list[tuple[str, _Pipeline]] = []
        while self.is_op("&&", "||"):
            op = self.take().text
            while self.kind() == "nl":
                self.i += 1
            rest.append((op, self.pipeline()))
        return _AndOr(first, rest)

    def pipeline(self) -> _Pipeline:
        negate = False
        if self.is_word("!"):
            self.i += 1
            negate = True
        commands = [self.command()]
        while self.is_op("|", "|&"):
            self.i += 1
            while self.kind() == "nl":
                self.i += 1
            commands.append(self.command())
        return _Pipeline(negate, commands)

    def command(self) -> object:
        tok = self.peek()
        assert tok is not None
        if tok.kind == "word":
            if tok.text == "if":
                return self._if()
            if tok.text == "case":
                return self._case()
            if tok.text in ("for", "while", "until", "select"):
                return self._loop()
            if tok.text == "{":
                self.i += 1
                body = self.parse_list({"}"})
                self.expect_word("}")
                return self._redirects(_Group(tok.line, body))
            if tok.text == "function":
                self.i += 1
                name = self.take().text
                if self.is_op("("):
                    self.i += 2
                return self._func(tok.line, name)
            nxt = self.t[self.i + 1] if self.i + 1 < len(self.t) else None
            if (nxt is not None and nxt.kind == "op" and nxt.text == "("
                    and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:-]*", tok.text)):
                self.i += 3  # name ( )
                return self._func(tok.line, tok.text)
        if tok.kind == "op" and tok.text == "(":
            self.i += 1
            body = self.parse_list({")"})
            if not self.is_op(")"):
                raise ShellSyntaxError(f"line {tok.line}: subshell ( left open")
            self.i += 1
            return self._redirects(_Group(tok.line, body))
        return self._simple()

    def _func(self, line: int, name: str) -> _Func:
        self.skip_newlines()
        body = self.command()
        return _Func(line, name, [_AndOr(_Pipeline(False, [body]), [])])

    def _redirects(self, node: object) -> object:
        while self.kind() == "redir":
            self.i += 2
        return node

    def _simple(self) -> _Simple:
        tok = self.peek()
        assert tok is not None
        node = _Simple(tok.line)
        while True:
            tok = self.peek()
            if tok is None or tok.kind in ("nl", "op"):
                break
            if tok.kind == "redir":
                self.i += 1
                if self.kind() == "word":
                    self.i += 1
                continue
            if not node.words and tok.kind == "word" and tok.text in _RESERVED_END | {"in"}:
                if not node.assigns:
                    raise ShellSyntaxError(f"line {tok.line}: unexpected {tok.text!r}")
                break
            self.i += 1
            if tok.kind == "array" or (not node.words and _ASSIGN_RE.match(tok.text)):
                node.assigns.append(tok)
            else:
                node.words.append(tok)
        if not node.words and not node.assigns:
            bad = self.peek()
            raise ShellSyntaxError(f"line {node.line}: unexpected "
                                   f"{bad.text if bad else 'end of script'!r}")
        return node

    def _if(self) -> _If:
        line = self.take().line
        clauses: list[tuple[list[object], list[object]]] = []
        otherwise: list[object] | None = None
        while True:
            cond = self.parse_list({"then"})
            self.expect_word("then")
            body = self.parse_list({"elif", "else", "fi"})
            clauses.append((cond, body))
            tok = self.take()
            if tok.text == "elif":
                continue
            if tok.text == "else":
                otherwise = self.parse_list({"fi"})
                self.expect_word("fi")
            break
        return _If(line, clauses, otherwise)

    def _case(self) -> _Case:
        line = self.take().line
        word = self.take()
        self.skip_newlines()
        self.expect_word("in")
        items: list[tuple[list[_Tok], list[object]]] = []
        while True:
            self.skip_newlines()
            if self.is_word("esac"):
                self.i += 1
                return _Case(line, word, items)
            if self.is_op("("):
                self.i += 1
            patterns = [self.take()]
            while self.is_op("|"):
                self.i += 1
                patterns.append(self.take())
            if not self.is_op(")"):
                raise ShellSyntaxError(f"line {patterns[0].line}: expected ) after a case "
                                       "pattern")
            self.i += 1
            body = self.parse_list({"esac", ";;", ";&", ";;&"})
            if self.is_op(";;", ";&", ";;&"):
                self.i += 1
            items.append((patterns, body))

    def _loop(self) -> _Loop:
        tok = self.take()
        kind = "for" if tok.text == "select" else tok.text
        var: str | None = None
        items: list[_Tok] | None = None
        cond: list[object] = []
        if kind == "for":
            if self.is_op("("):
                while not self.is_word("do") and self.peek() is not None:
                    self.i += 1
            else:
                var = self.take().text
                self.skip_newlines()
                if self.is_word("in"):
                    self.i += 1
                    items = []
                    while self.kind() == "word":
                        items.append(self.take())
            self.skip_newlines()
        else:
            cond = self.parse_list({"do"})
        self.expect_word("do")
        body = self.parse_list({"done"})
        self.expect_word("done")
        self._redirects(None)
        return _Loop(tok.line, kind, var, items, cond, body)


# ----- evaluation ------------------------------------------------------------------------------


class _Exit(Exception):
    """``exit`` (or ``return`` in a function): stop this path of the script."""


@dataclass
class _State:
    variables: dict[str, Value]
    functions: dict[str, _Func]
    conditional: int | None = None
    depth: int = 0


Status = bool | None


class Evaluator:
    """Evaluate a script's text; ``inputs`` are environment variables known before it runs and
    ``runtime`` the names a scheduler or launcher sets at run time (unknown unless in inputs)."""

    def __init__(self, text: str, inputs: Mapping[str, str] | None = None,
                 runtime: tuple[str, ...] = (), directory: Path | None = None) -> None:
        self.source = text.splitlines()
        self.result = Script()
        variables: dict[str, Value] = {name: Unknown(f"${name} is set when the job runs")
                                       for name in runtime}
        self.directory = directory
        if directory is not None:
            # read as run from its own directory: `pwd` and $PWD are the script's folder
            variables["PWD"] = Scalar(str(directory), 0, 0)
        for name, text_value in (inputs or {}).items():
            variables[name] = Scalar(text_value, 0, 0)
        self.text = text
        self.state = _State(variables, {})
        self.steps = 0
        self.line_override: int | None = None
        self.sourced = 0

    def run(self) -> Script:
        nodes = _Parser(_Lexer(self.text).run()).parse_list()
        with contextlib.suppress(_Exit):
            self._list(nodes, self.state)
        self.result.variables = self.state.variables
        return self.result

    # -- lists and compounds --

    def _list(self, nodes: list[object], st: _State) -> Status:
        status: Status = True
        for node in nodes:
            status = self._node(node, st)
        return status

    def _node(self, node: object, st: _State) -> Status:
        if isinstance(node, _AndOr):
            status = self._pipeline(node.first, st)
            for op, pipe in node.rest:
                run = status if op == "&&" else (None if status is None else not status)
                if run is True:
                    status = self._pipeline(pipe, st)
                elif run is None:
                    line = _first_line(pipe)
                    self._alternatives(st, line, [lambda s, p=pipe: self._pipeline(p, s), None],
                                       f"line {line}: runs only if the command before "
                                       f"{op} succeeds or fails")
                    status = None
            return status
        if isinstance(node, _If):
            return self._if(node, st)
        if isinstance(node, _Case):
            return self._case(node, st)
        if isinstance(node, _Loop):
            return self._loop(node, st)
        if isinstance(node, _Group):
            return self._list(node.body, st)
        if isinstance(node, _Func):
            st.functions[node.name] = node
            return True
        assert isinstance(node, _Simple)
        return self._simple(node, st)

    def _pipeline(self, pipe: _Pipeline, st: _State) -> Status:
        status: Status = None
        for command in pipe.commands:
            status = self._node(command, st)
        if len(pipe.commands) > 1:
            status = None
        return (None if status is None else not status) if pipe.negate else status

    def _if(self, node: _If, st: _State) -> Status:
        branches: list[Callable[[_State], Status] | None] = []
        for cond, body in node.clauses:
            status = self._list(cond, st)
            if status is True and not branches:
                return self._list(body, st)
            if status is True:
                branches.append(lambda s, b=body: self._list(b, s))
                self._alternatives(st, node.line, branches, self._why(node.line))
                return None
            if status is None:
                branches.append(lambda s, b=body: self._list(b, s))
        rest = node.otherwise
        if not branches:
            return self._list(rest, st) if rest is not None else True
        branches.append((lambda s: self._list(rest, s)) if rest is not None else None)
        self._alternatives(st, node.line, branches, self._why(node.line))
        return None

    def _why(self, line: int) -> str:
        text = self.source[line - 1].strip() if 0 < line <= len(self.source) else ""
        return f"line {line}: condition not known without running the script ({text[:60]})"

    def _case(self, node: _Case, st: _State) -> Status:
        subject = _known(self._string(node.word, st))
        candidates: list[Callable[[_State], Status] | None] = []
        for patterns, body in node.items:
            matched: Status = False
            for pattern in patterns:
                text = _known(self._string(pattern, st))
                if subject is None or text is None:
                    matched = None
                elif fnmatch.fnmatchcase(subject, text):
                    matched = True
                    break
            if matched is True and not candidates:
                return self._list(body, st)
            if matched is True:
                candidates.append(lambda s, b=body: self._list(b, s))
                break
            if matched is None:
                candidates.append(lambda s, b=body: self._list(b, s))
        else:
            if not candidates:
                return True
            candidates.append(None)
        self._alternatives(st, node.line, candidates,
                           f"line {node.line}: case on a value not known without running the "
                           f"script ({node.word.text})")
        return None

    def _loop(self, node: _Loop, st: _State) -> Status:
        if node.kind == "for" and node.items is not None and node.var:
            values: list[str | None] = []
            for tok in node.items:
                values += [f for f, _ in self._fields(tok.text, tok.line, st)]
            if None not in values and len(values) <= _MAX_LOOP_ITEMS:
                for value in values:
                    assert value is not None
                    st.variables[node.var] = Scalar(value, node.line, node.line)
                    self._list(node.body, st)
                return True
        var = node.var

        def once(s: _State) -> Status:
            if var:
                s.variables[var] = Unknown(f"the loop variable of line {node.line}")
            return self._list(node.body, s)

        self._alternatives(st, node.line, [once, None],
                           f"line {node.line}: loop body read once, as a branch that may or "
                           "may not run")
        return True

    def _alternatives(self, st: _State, line: int,
                      branches: list[Callable[[_State], Status] | None], why: str) -> None:
        """Run each branch on a copy of the state; keep what they agree on."""
        if why not in self.result.notes:
            self.result.notes.append(why)
        outcomes: list[dict[str, Value]] = []
        for branch in branches:
            copy = _State(dict(st.variables), st.functions,
                          st.conditional if st.conditional is not None else line, st.depth)
            try:
                if branch is not None:
                    branch(copy)
            except _Exit:
                continue
            outcomes.append(copy.variables)
        if not outcomes:
            raise _Exit
        names = sorted(set().union(*outcomes))
        for name in names:
            seen = [o.get(name) for o in outcomes]
            if all(_same(v, seen[0]) for v in seen):
                if seen[0] is None:
                    st.variables.pop(name, None)
                else:
                    st.variables[name] = seen[0]
            else:
                st.variables[name] = Unknown(f"set differently in the branches of line {line}")

    # -- simple commands --

    def _simple(self, node: _Simple, st: _State) -> Status:
        self.steps += 1
        if self.steps > _MAX_STEPS:
            raise ShellSyntaxError(f"line {node.line}: more than {_MAX_STEPS} commands to "
                                   "follow (loops and branches); not a launch script")
        if not node.words:
            for tok in node.assigns:
                self._assign(tok, st)
            return True
        fields: list[tuple[str, int, str]] = []
        for tok in node.words:
            fields += [(f, line, tok.text) for f, line in self._raw_fields(tok.text, tok.line, st)]
        if not fields:
            for tok in node.assigns:
                self._assign(tok, st)
            return True
        name = _known(fields[0][0])
        if name is None:
            self._emit(fields, None, st)
            return None
        base = name.rsplit("/", 1)[-1]
        args = [_known(f) for f, _, _ in fields[1:]]
        if base in _DECLARE:
            if base == "export":
                self._export(node)
            return self._declare(node, st)
        if base in ("[", "[[", "test"):
            return _test([a for a in args if a != "]" and a != "]]"], base == "[[")
        if base in ("true", ":"):
            return True
        if base == "false":
            return False
        if base in ("exit", "return"):
            raise _Exit
        if base == "unset":
            for arg in args:
                if arg and not arg.startswith("-"):
                    st.variables.pop(arg, None)
            return True
        if base in ("source", "."):
            return self._source(node, args[0] if args else None, st)
        if base == "eval" and None not in args:
            self._nested(" ".join(a or "" for a in args), node.line, fields[0][2], st)
            return None
        # bash -c STRING, also behind a launcher: srun ... bash -c "$LAUNCHER $CMD"
        words = [f for f, _, _ in fields]
        for k in range(len(words) - 2):
            shell_name = words[k].rsplit("/", 1)[-1]
            if shell_name in ("bash", "sh") and words[k + 1] == "-c":
                self._emit(fields[:k], name, st)
                self._nested(words[k + 2], node.line, fields[k + 2][2], st)
                return None
        if name in st.functions and st.depth < _MAX_DEPTH:
            func = st.functions[name]
            inner = _State(st.variables, st.functions, st.conditional, st.depth + 1)
            try:
                return self._list(func.body, inner)
            except _Exit:
                return None
        self._emit(fields, name, st)
        return None

    def _emit(self, fields: list[tuple[str, int, str]], command: str | None,
              st: _State) -> None:
        for text, line, raw in fields:
            self.result.words.append(Word(_known(text), raw, self.line_override or line,
                                          command, st.conditional))

    def _source(self, node: _Simple, name: str | None, st: _State) -> Status:
        """``source FILE``: a file next to the script is read in place (its variables and
        commands count, at the line of the source command); any other is noted."""
        raw = " ".join(tok.text for tok in node.words[1:])[:60]
        target = Path(name) if name else None
        if target is not None and not target.is_absolute() and self.directory is not None:
            target = self.directory / target
        if (target is None or self.directory is None or not target.is_file()
                or target.stat().st_size > _MAX_SOURCED_BYTES
                or self.sourced >= _MAX_SOURCED):
            self.result.notes.append(f"line {node.line}: {raw} is sourced; what it sets is "
                                     "not read")
            return None
        self.sourced += 1
        try:
            text = target.read_text(encoding="utf-8")
            nodes = _Parser(_Lexer(text).run()).parse_list()
        except (OSError, UnicodeDecodeError, ShellSyntaxError):
            self.result.notes.append(f"line {node.line}: {raw} could not be read; ignored")
            return None
        self.result.notes.append(f"line {node.line}: read {target.name}, which it sources")
        saved, self.line_override = self.line_override, self.line_override or node.line
        try:
            return self._list(nodes, st)
        finally:
            self.line_override = saved

    def _nested(self, script: str, line: int, raw: str, st: _State) -> None:
        """``bash -c STRING``: the string's commands, with the caller's variables."""
        try:
            nodes = _Parser(_Lexer(script, line).run()).parse_list()
        except ShellSyntaxError:
            self.result.notes.append(f"line {line}: could not read the {raw} command string")
            return
        saved = self.source
        try:
            self._list(nodes, _State(dict(st.variables), st.functions, st.conditional,
                                     st.depth + 1))
        except _Exit:
            pass
        finally:
            self.source = saved
        words = self.result.words
        for k in range(len(words) - 1, -1, -1):
            if words[k].line < line:
                break
            words[k] = Word(words[k].text, words[k].raw, self._written_at(words[k].text, line),
                            words[k].command, words[k].conditional)

    def _written_at(self, text: str | None, line: int) -> int:
        """For a word of a ``bash -c`` string: the last line up to ``line`` where a flag is
        written (its value came through variables, so the string itself has no lines)."""
        if text is None or not text.startswith("-"):
            return line
        pattern = re.compile(rf"(?<![^\s\"'=(]){re.escape(text)}(?![^\s\"'\\)=])")
        for number in range(min(line, len(self.source)), 0, -1):
            if pattern.search(self.source[number - 1]):
                return number
        return line

    def _export(self, node: _Simple) -> None:
        for tok in node.words[1:]:
            match = _ASSIGN_RE.match(tok.text) if tok.kind != "array" else None
            name = match.group(1) if match else tok.text
            if re.fullmatch(_NAME, name) and name not in self.result.exported:
                self.result.exported.append(name)

    def _declare(self, node: _Simple, st: _State) -> Status:
        for tok in node.words[1:]:
            if tok.kind == "array" or _ASSIGN_RE.match(tok.text):
                self._assign(tok, st)
        for tok in node.assigns:
            self._assign(tok, st)
        return True

    def _assign(self, tok: _Tok, st: _State) -> None:
        if tok.kind == "array":
            match = _ARRAY_START_RE.match(tok.text)
            assert match is not None
            name, append = match.group(1), bool(match.group(2))
            items: list[tuple[str, int]] = []
            for raw, line in tok.items:
                items += self._raw_fields(raw, line, st)
            old = st.variables.get(name)
            if append and isinstance(old, Array):
                items = list(old.items) + items
            elif append and isinstance(old, Scalar):
                items = [(old.text, old.line)] + items
            elif append and isinstance(old, Unknown):
                st.variables[name] = old
                return
            if self.line_override:
                items = [(text, self.line_override) for text, _ in items]
            st.variables[name] = Array(tuple(items))
            return
        match = _ASSIGN_RE.match(tok.text)
        assert match is not None
        name, index, append, raw = match.groups()
        end = max(tok.end, tok.line)
        value = self._string(raw, st, tok.line)
        old = st.variables.get(name)
        if index:
            st.variables[name] = Unknown(f"${name} is set element by element")
            return
        if value == UNKNOWN_MARK:
            st.variables[name] = Unknown(f"${name} needs a command or a value set when the job "
                                         "runs")
        elif append and isinstance(old, Array):
            st.variables[name] = Array(old.items[:-1] + (
                ((old.items[-1][0] or "") + value, old.items[-1][1]),) if old.items
                else ((value, tok.line),))
        elif append and isinstance(old, Unknown):
            return
        else:
            prefix = old.text if append and isinstance(old, Scalar) else ""
            line = self.line_override or tok.line
            st.variables[name] = Scalar(prefix + value, line,
                                        line if self.line_override else end)

    # -- expansion --

    def _string(self, raw: str | _Tok, st: _State, line: int = 0) -> str:
        """A word expanded without splitting (assignments, case words, patterns); run-time
        parts are UNKNOWN_MARK."""
        if isinstance(raw, _Tok):
            line, raw = raw.line, raw.text
        return _Expander(self, st, line).expand(raw, split=False)[0][0]

    def _raw_fields(self, raw: str, line: int, st: _State) -> list[tuple[str, int]]:
        return _Expander(self, st, line).expand(raw, split=True)

    def _fields(self, raw: str, line: int, st: _State) -> list[tuple[str | None, int]]:
        """A word expanded and split into fields as bash does; None for a field known only
        when the script runs."""
        return [(_known(text), at) for text, at in self._raw_fields(raw, line, st)]

    def origin_line(self, text: str, default: int, end: int) -> int:
        """The line of ``default``..``end`` (a multi-line string) where ``text`` is written as
        a word, else ``default``."""
        pattern = re.compile(rf"(?<![^\s\"'=(]){re.escape(text)}(?![^\s\"'\\)])")
        for number in range(max(default, 1), min(end, len(self.source)) + 1):
            if pattern.search(self.source[number - 1]):
                return number
        return default


def _first_line(pipe: _Pipeline) -> int:
    command = pipe.commands[0]
    return getattr(command, "line", 0)


def _same(a: Value | None, b: Value | None) -> bool:
    if isinstance(a, Scalar) and isinstance(b, Scalar):
        return a.text == b.text
    if isinstance(a, Array) and isinstance(b, Array):
        return [x for x, _ in a.items] == [x for x, _ in b.items]
    if isinstance(a, Unknown) and isinstance(b, Unknown):
        return True
    return a is None and b is None


class _Unresolved(Exception):
    """A bracket or quote that does not close inside one word."""


def _known(text: str) -> str | None:
    return None if UNKNOWN_MARK in text else text


class _Expander:
    """One word's expansion: quote removal, parameters, arithmetic, then field splitting.

    A part known only at run time becomes UNKNOWN_MARK, so the rest of a string (or of an
    array) stays readable: ``"--data-path $1"`` still holds ``--data-path``.
    """

    def __init__(self, ev: Evaluator, st: _State, line: int) -> None:
        self.ev, self.st, self.line = ev, st, line
        self.fields: list[tuple[str, int]] = []
        self.cur = ""
        self.cur_line = line
        self.have = False
        self.split = True

    def expand(self, raw: str, split: bool) -> list[tuple[str, int]]:
        self.split = split
        try:
            self._scan(raw, quoted=False)
        except (_Unresolved, ValueError):
            return [(UNKNOWN_MARK, self.line)]
        if self.have:
            self.fields.append((self.cur, self.cur_line))
        if not split:
            return [("".join(f for f, _ in self.fields), self.line)]
        return list(self.fields)

    # field building
    def _literal(self, text: str) -> None:
        if not self.have:
            self.cur_line = self.line
        self.cur += text
        self.have = True

    def _unknown(self) -> None:
        self._literal(UNKNOWN_MARK)

    def _unquoted_value(self, text: str, line: int, end: int = 0) -> None:
        if not self.split:
            self._literal(text)
            return
        if text[:1].isspace() and self.have:
            self._push()
        pieces = text.split()
        for k, piece in enumerate(pieces):
            if k:
                self._push()
            if not self.have:
                self.cur_line = self.ev.origin_line(piece, line, end)
            self.cur += piece
            self.have = True
        if pieces and text[-1:].isspace():
            self._push()

    def _push(self) -> None:
        if self.have:
            self.fields.append((self.cur, self.cur_line))
        self.cur, self.have = "", False

    def _scan(self, raw: str, quoted: bool) -> None:
        i = 0
        while i < len(raw):
            c = raw[i]
            if c == "\\":
                nxt = raw[i + 1:i + 2]
                if quoted and nxt not in ('"', "\\", "$", "`"):
                    self._literal("\\" + nxt)
                else:
                    self._literal(nxt)
                i += 2
            elif c == "'" and not quoted:
                end = raw.index("'", i + 1)
                self._literal(raw[i + 1:end])
                i = end + 1
            elif c == '"' and not quoted:
                end = _closing_quote(raw, i + 1)
                self._literal("")
                self._scan(raw[i + 1:end], quoted=True)
                i = end + 1
            elif c == "`":
                end = raw.index("`", i + 1)
                self._substitution(raw[i + 1:end])
                i = end + 1
            elif c == "$" and raw.startswith("$((", i) and _is_arith(raw, i):
                end = _matching(raw, i + 1, "(", ")")
                self._arith(raw[i + 3:end - 1], quoted)
                i = end + 1
            elif c == "$" and raw.startswith("$(", i):
                end = _matching(raw, i + 1, "(", ")")
                self._substitution(raw[i + 2:end])
                i = end + 1
            elif c == "$" and raw.startswith("${", i):
                end = _matching(raw, i + 1, "{", "}")
                self._parameter(raw[i + 2:end], quoted)
                i = end + 1
            elif c == "$" and i + 1 < len(raw) and (raw[i + 1].isalnum()
                                                     or raw[i + 1] in "_@*#?$!"):
                match = re.match(rf"{_NAME}|[0-9@*#?$!]", raw[i + 1:])
                assert match is not None
                self._parameter(match.group(0), quoted)
                i += 1 + len(match.group(0))
            elif c == "$" and i + 1 < len(raw) and raw[i + 1] in "'\"" and not quoted:
                i += 1  # $'..' and $"..": read as the quoted string
            else:
                self._literal(c)
                i += 1

    def _substitution(self, command: str) -> None:
        """``$(pwd)`` is the script's folder (read as run from there); any other command's
        output is known only when it runs."""
        if command.strip() == "pwd" and self.ev.directory is not None:
            self._literal(str(self.ev.directory))
        else:
            self._unknown()

    def _value(self, text: str, quoted: bool, line: int, end: int = 0) -> None:
        if quoted:
            self._literal(text)
        else:
            self._unquoted_value(text, line, end)

    def _arith(self, inner: str, quoted: bool) -> None:
        expanded = _known(_Expander(self.ev, self.st, self.line).expand(inner, split=False)[0][0])

        def lookup(name: str) -> str | None:
            item = self.st.variables.get(name)
            return _known(item.text) if isinstance(item, Scalar) else None

        value = arithmetic(expanded, lookup) if expanded is not None else None
        if value is None:
            self._unknown()
        else:
            self._value(str(value), quoted, self.line)

    def _lookup(self, name: str) -> Value | None:
        if name.isdigit():
            return None if name != "0" else Unknown("the script's path")
        if name in "@*#?$!":
            return Unknown("a run-time value")
        return self.st.variables.get(name)

    def _parameter(self, body: str, quoted: bool) -> None:
        if body.startswith("#") and len(body) > 1:
            name, index = _name_index(body[1:])
            item = self._lookup(name)
            if isinstance(item, Unknown):
                self._unknown()
            elif index in ("@", "*"):
                count = len(item.items) if isinstance(item, Array) else (0 if item is None else 1)
                self._value(str(count), quoted, self.line)
            else:
                text = _scalar(item, index)
                if text is not None and UNKNOWN_MARK in text:
                    self._unknown()
                else:
                    self._value(str(len(text or "")), quoted, self.line)
            return
        match = re.match(rf"({_NAME}|[0-9]+|[@*#?$!])(\[[^\]]*\])?", body)
        if not match:
            raise _Unresolved
        name = match.group(1)
        index = match.group(2)[1:-1] if match.group(2) else None
        rest = body[match.end():]
        item = self._lookup(name)
        if isinstance(item, Unknown) or (name.isdigit() and name != "0" and not rest):
            self._unknown()  # set at run time, or one of the script's arguments
            return
        if index in ("@", "*") and isinstance(item, Array):
            if not rest:
                self._array(item, quoted and index == "@", quoted)
                return
            # ${ARR[@]:-word}: the word when the array is unset or (with :) expands to nothing
            empty = not item.items or (rest.startswith(":") and
                                       all(text == "" for text, _ in item.items))
            if rest[:2] in (":-", ":+") or rest[:1] in ("-", "+"):
                use_word = empty if "-" in rest[:2] else not empty
                if not use_word and "-" in rest[:2]:
                    self._array(item, quoted and index == "@", quoted)
                elif use_word:
                    word = rest[2:] if rest.startswith(":") else rest[1:]
                    self._value(self._sub(word), quoted, self.line)
                return
            self._unknown()
            return
        text = _scalar(item, index)
        if text is None and isinstance(item, Array) and index is not None and index.isdigit():
            text = None if rest else ""  # an element past the end is unset: empty
        line = item.line if isinstance(item, Scalar) and item.line else self.line
        end = item.end_line if isinstance(item, Scalar) and item.line else 0
        if rest:
            text = self._operator(name, text, rest)
        if text is None:
            self._unknown()
        else:
            self._value(text, quoted, line, end)

    def _array(self, item: Array, separate: bool, quoted: bool) -> None:
        if not separate:
            joined = " ".join(x or "" for x, _ in item.items)
            if quoted:
                self._literal(joined)
            else:
                for text, line in item.items:
                    self._unquoted_value(" " + (text or "") + " ", line)
            return
        for k, (text, line) in enumerate(item.items):
            if k:
                self._push()
            if not self.have:
                self.cur_line = line
            self.cur += text or ""
            self.have = True

    def _operator(self, name: str, text: str | None, rest: str) -> str | None:
        op_match = re.match(r"(:?[-=+?])|(%%|%|##|#|//|/|\^\^|\^|,,|,)|(:)", rest)
        if not op_match:
            raise _Unresolved
        op = op_match.group(0)
        word = rest[len(op):]
        if op_match.group(1):
            if text is not None and UNKNOWN_MARK in text and text.strip(UNKNOWN_MARK) == "":
                return None  # may or may not be empty when it runs
            unset = text is None or (op.startswith(":") and text == "")
            if op.endswith("-"):
                return self._sub(word) if unset else text
            if op.endswith("="):
                if unset:
                    value = self._sub(word)
                    self.st.variables[name] = Scalar(value, self.line, self.line)
                    return value
                return text
            if op.endswith("+"):
                return "" if unset else self._sub(word)
            return None if unset else text
        if text is None or UNKNOWN_MARK in text:
            return None
        if op_match.group(3):  # ${X:offset:length}
            parts = word.split(":")
            try:
                offset = int(parts[0])
                length = int(parts[1]) if len(parts) > 1 else None
            except ValueError:
                return None
            return text[offset:] if length is None else text[offset:offset + length]
        if op in ("^^", "^"):
            return text.upper() if op == "^^" else text[:1].upper() + text[1:]
        if op in (",,", ","):
            return text.lower() if op == ",," else text[:1].lower() + text[1:]
        if op.startswith("/"):
            pattern, _, replacement = word.partition("/")
            pattern, replacement = self._sub(pattern), self._sub(replacement)
            if UNKNOWN_MARK in pattern:
                return None
            return text.replace(pattern, replacement, -1 if op == "//" else 1)
        pattern = self._sub(word)
        return None if UNKNOWN_MARK in pattern else _trim(text, pattern, op)

    def _sub(self, word: str) -> str:
        return _Expander(self.ev, self.st, self.line).expand(word, split=False)[0][0]


def _trim(text: str, pattern: str, op: str) -> str:
    """``${X%pat}``, ``${X%%pat}``, ``${X#pat}``, ``${X##pat}`` with glob patterns."""
    n = len(text)
    if op.startswith("#"):
        ends = range(n + 1) if op == "#" else range(n, -1, -1)
        for end in ends:
            if fnmatch.fnmatchcase(text[:end], pattern):
                return text[end:]
        return text
    starts = range(n, -1, -1) if op == "%" else range(n + 1)
    for start in starts:
        if fnmatch.fnmatchcase(text[start:], pattern):
            return text[:start]
    return text


def _scalar(item: Value | None, index: str | None) -> str | None:
    if isinstance(item, Scalar):
        return item.text if index in (None, "0") else None
    if isinstance(item, Array):
        position = int(index) if index is not None and index.isdigit() else 0
        if index is not None and not index.isdigit():
            return None
        return item.items[position][0] if position < len(item.items) else None
    return None


def _name_index(body: str) -> tuple[str, str | None]:
    match = re.match(rf"({_NAME})(?:\[([^\]]*)\])?$", body)
    if not match:
        raise _Unresolved
    return match.group(1), match.group(2)


def _closing_quote(raw: str, start: int) -> int:
    i = start
    while i < len(raw):
        if raw[i] == "\\":
            i += 2
            continue
        if raw[i] == '"':
            return i
        if raw[i] == "$" and raw[i + 1:i + 2] in ("(", "{"):
            i = _matching(raw, i + 1, raw[i + 1], ")" if raw[i + 1] == "(" else "}") + 1
            continue
        i += 1
    raise _Unresolved


def _matching(raw: str, start: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one at ``start``."""
    depth = 0
    i = start
    while i < len(raw):
        c = raw[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and open_ == "(":
            i = raw.index("'", i + 1) + 1
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise _Unresolved


def _is_arith(raw: str, i: int) -> bool:
    """``$((`` opens arithmetic unless it closes as ``$( (cmd) )``."""
    try:
        end = _matching(raw, i + 1, "(", ")")
    except _Unresolved:
        return False
    return raw[end - 1] == ")"


# ----- test / [ / [[ ---------------------------------------------------------------------------


def _test(args: list[str | None], double: bool) -> Status:
    """``[``, ``test`` and ``[[`` on strings and integers; file tests and =~ are unknown."""
    for joiner in ("||", "-o"):
        if joiner in args and (double or joiner == "-o"):
            k = args.index(joiner)
            return _or(_test(args[:k], double), _test(args[k + 1:], double))
    for joiner in ("&&", "-a"):
        if joiner in args and (double or joiner == "-a") and len(args) != 2:
            k = args.index(joiner)
            return _and(_test(args[:k], double), _test(args[k + 1:], double))
    if args and args[0] == "!":
        inner = _test(args[1:], double)
        return None if inner is None else not inner
    if args and args[0] == "(" and args[-1] == ")":
        return _test(args[1:-1], double)
    if None in args:
        return None
    words = [a for a in args if a is not None]
    if not words:
        return False
    if len(words) == 1:
        return words[0] != ""
    if len(words) == 2:
        op, value = words
        if op == "-z":
            return value == ""
        if op == "-n":
            return value != ""
        return None  # -f, -d, -e ...: the file system when it runs
    if len(words) == 3:
        left, op, right = words
        if op in ("=", "=="):
            return fnmatch.fnmatchcase(left, right) if double else left == right
        if op == "!=":
            return not fnmatch.fnmatchcase(left, right) if double else left != right
        numeric = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__,
                   "-gt": int.__gt__, "-ge": int.__ge__}
        if op in numeric:
            try:
                return bool(numeric[op](int(left), int(right)))
            except ValueError:
                return None
        if op in ("<", ">"):
            return (left < right) if op == "<" else (left > right)
    return None


def _or(a: Status, b: Status) -> Status:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _and(a: Status, b: Status) -> Status:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def evaluate(text: str, inputs: Mapping[str, str] | None = None,
             runtime: tuple[str, ...] = (), directory: Path | None = None) -> Script:
    """Evaluate ``text``; raises ShellSyntaxError on constructs it cannot follow.

    ``directory``: the script's folder, for ``source`` of files next to it and ``pwd``."""
    try:
        return Evaluator(text, inputs, runtime, directory).run()
    except RecursionError:
        raise ShellSyntaxError("nested too deeply") from None
