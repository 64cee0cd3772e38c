"""hcc.grammar.parser — the front door of the grammar: ``parse(text, path) -> ast.Module``.

The grammar (``hcl.lark``) ships as package data and is opened relative to this module; it is
built once per process with LALR(1) and ``propagate_positions`` (style.md habit 4). Lark's
syntax exceptions are mapped onto :class:`SourceError` with the line and column of the
offending token, and "expected …" listed in words a user knows ("a name", "'='") rather than
lark's terminal names (style.md habit 5, after lark's ``UnexpectedInput`` and xDSL's
``ParseError``).
"""
from __future__ import annotations

import functools
from pathlib import Path

from lark import Lark
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from . import ast
from .diagnostics import Source, SourceError, Span
from .transform import ToAst

GRAMMAR_PATH = Path(__file__).with_name("hcl.lark")

# 16 MiB of source: the largest sample (dgx1.hcl) is under 4 KB and a 1024-rank fat tree is 26
# lines; lark takes about a second per MB, so this bounds a parse to tens of seconds.
MAX_SOURCE_CHARS = 16 << 20

# Terminals that are patterns, in words; literal terminals are shown quoted as written.
_WORDS = {
    "NAME": "a name",
    "INT": "an integer",
    "QUANTITY": "a number with its unit (like 25 GB/s)",
    "MULT": "a multiplicity like x2",
    "$END": "the end of the file",
}
# The order expected items are listed in: words first, then keywords, then punctuation.
_RANK = {"NAME": 0, "QUANTITY": 1, "INT": 2, "MULT": 3}


@functools.lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(
        GRAMMAR_PATH.read_text(encoding="utf-8"),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )


@functools.lru_cache(maxsize=1)
def _literals() -> dict[str, str]:
    """Terminal name -> its literal text, for every terminal that is a plain string."""
    return {t.name: t.pattern.value for t in _lark().terminals if t.pattern.type == "str"}


def describe_terminal(name: str) -> str:
    """A terminal in words: ``"NAME"`` -> ``"a name"``, ``"LBRACE"`` -> ``"'{'"``."""
    if name in _WORDS:
        return _WORDS[name]
    lit = _literals().get(name)
    return f"'{lit}'" if lit is not None else name.lower()


def describe_expected(names) -> str:
    """``{"NAME", "RBRACE"}`` -> ``"a name or '}'"``."""
    lits = _literals()
    keyed = sorted(
        set(names) - {"COMMENT", "WS"},
        key=lambda n: (_RANK.get(n, 5 if n in lits and lits[n].isalpha() else 9), describe_terminal(n)),
    )
    words = [describe_terminal(n) for n in keyed]
    if not words:
        return "nothing more"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _end_span(source: Source) -> Span:
    """Just after the last character that is not blank or a comment."""
    lines = source.text.split("\n")  # lines as lark counts them (see Source.line)
    for i in range(len(lines) - 1, -1, -1):
        code = lines[i].split("#", 1)[0].rstrip()
        if code:
            return Span(source, i + 1, len(code) + 1)
    return Span(source, 1, 1)


def _what(tok) -> str:
    """The offending token in words: ``name 'foo'``, ``number '3a'``, ``'{'``."""
    kind = {"NAME": "name", "QUANTITY": "number", "INT": "integer"}.get(tok.type)
    return f"{kind} '{tok}'" if kind else f"'{tok}'"


def _accepts(ip) -> set[str]:
    """Terminals the parser in state ``ip`` can really take next. Lark's own ``expected``
    comes from an LALR state whose lookaheads were merged with other contexts' (a part of a
    host name also accepts '{'), so it lists tokens that would fail a moment later."""
    try:
        return set(ip.accepts())
    except Exception:  # lark's probe may trip on $END in an accepting state; fall back
        return {t for t in ip.choices() if t.isupper()}


def _diagnose(source: Source) -> SourceError:
    """Re-run the parse token by token, keeping the state before each token, so the error
    lists what that state accepts. Only runs after a failed parse: the copies cost ~2x."""
    ip = _lark().parse_interactive(source.text)
    tokens = ip.lexer_thread.lex(ip.parser_state)
    fed: list = []
    while True:
        try:  # a lexer error happens before the token exists: the current state is the one
            tok = next(tokens)
        except StopIteration:
            break
        except UnexpectedInput as e:
            return _syntax_error(source, e, _accepts(ip), fed)
        before = ip.copy(deepcopy_values=False)
        try:
            ip.feed_token(tok)
        except UnexpectedInput as e:
            return _syntax_error(source, e, _accepts(before), fed)
        fed.append(tok)
    before = ip.copy(deepcopy_values=False)
    try:
        ip.feed_eof()
    except UnexpectedInput as e:
        return _syntax_error(source, e, _accepts(before), fed)
    raise AssertionError("a parse that failed once succeeded token by token")


def _missing_brace_hint(fed: list) -> str:
    """``topology``/``collective`` read as a vertex name means the block before it is open."""
    for t in reversed(fed[-2:]):
        if t.type == "NAME" and str(t) in ("topology", "collective"):
            return f"is a '}}' missing before '{t}' on line {t.line}?"
    return ""


def _syntax_error(source: Source, e: UnexpectedInput, expected: set[str], fed: list = ()) -> SourceError:
    fed = list(fed)
    if isinstance(e, UnexpectedEOF) or (isinstance(e, UnexpectedToken) and e.token.type == "$END"):
        return SourceError(
            _end_span(source),
            f"unexpected end of file; expected {describe_expected(expected)}",
            _missing_brace_hint(fed),
        )
    if isinstance(e, UnexpectedToken):
        tok = e.token
        span = Span(source, tok.line, tok.column, tok.end_line, tok.end_column)
        hint = _missing_brace_hint(fed)
        if tok.type == "QUANTITY" and "NAME" in expected:
            hint = "a name starts with a letter or '_'"
        elif expected == {"EQUAL"} and len(fed) >= 2 and fed[-1].type == "NAME" \
                and fed[-2].type in ("NAME", "RSQB"):
            # `ranks = gpu0 gpu1`: gpu1 ends the list and reads as the next key
            hint = f"is a ',' missing before '{fed[-1]}', or an '=' after it?"
        return SourceError(span, f"unexpected {_what(tok)}; expected {describe_expected(expected)}", hint)
    if isinstance(e, UnexpectedCharacters):
        return SourceError(
            Span(source, e.line, e.column),
            f"unexpected character {e.char!r}; expected {describe_expected(expected)}",
            _missing_brace_hint(fed),
        )
    return SourceError(Span(source, getattr(e, "line", 1) or 1, getattr(e, "column", 1) or 1), str(e))


def parse(text: str, path: str = "<string>") -> ast.Module:
    """Parse HCL source text into an :class:`ast.Module`.

    Raises :class:`SourceError` (file:line:col, the line and a caret) on a syntax error.

    >>> m = parse("topology t { node a, b  a <-> b : 1 GB/s }")
    >>> [r.text() for r in m.topologies[0].body[0].refs]
    ['a', 'b']
    """
    if not isinstance(text, str):
        raise TypeError(f"parse: the source must be a str, got {type(text).__name__}")
    # lark counts lines at "\n" only; a file read by Python has its "\r\n" and lone "\r"
    # turned into "\n" already (universal newlines), and source text passed in gets the same
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    source = Source(path, text)
    if len(text) > MAX_SOURCE_CHARS:
        raise SourceError(Span(source, 1, 1), f"the program is {len(text)} characters long; "
                                              f"at most {MAX_SOURCE_CHARS} (16 MiB) are read")
    try:
        tree = _lark().parse(text)
    except UnexpectedInput:
        raise _diagnose(source) from None
    try:
        return ToAst(source).transform(tree)
    except VisitError as e:  # a SourceError raised while building the AST (a number too large)
        if isinstance(e.orig_exc, SourceError):
            raise e.orig_exc from None
        raise
