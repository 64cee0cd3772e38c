"""hcc.compiler.frontend — the AST of an HCL file to a checked :class:`Program`.

``load_program(path_or_source)`` parses (``grammar/parser.py``), expands ranges, resolves host
names, builds one :class:`~hcc.ir.topology.Topology` per ``topology`` block and one
:class:`CollectiveSpec` per ``collective`` block, and checks every fault of language.md
"Errors" on the way. Each fault is a :class:`SourceError` at the exact token (file:line:col,
the line and a caret), raised before any solver runs; nothing downstream re-validates input.

Terms
- expansion: ``gpu[0,3,5..6]`` -> ``gpu0, gpu3, gpu5, gpu6``; ``h[0..1].nvs`` -> ``h0.nvs,
  h1.nvs``. Inside ``host h[0..3] { … }`` a plain name ``gpu0`` means the host's own
  ``h0.gpu0`` (a top-level vertex of that name when the host has none).
- link expansion: every vertex of the left side against every vertex of the right side,
  self-pairs skipped. ``->`` gives one arc per ordered pair; ``<->`` one arc each way per
  unordered pair, so a clique ``a[0..n-1] <-> a[0..n-1]`` has exactly n(n-1) arcs and a star
  ``a[0..3] <-> s`` has 8. ``x k`` multiplies the link's capacity by k.
- sub-topology of a collective: its ranks and every switch (``Topology.restricted``); nodes
  that are not ranks neither send, receive nor forward for it (language.md "Collectives").
- reachability: a rooted collective needs every rank reachable from the root (broadcast,
  scatter) or able to reach it (reduce, gather); the unrooted kinds need the ranks strongly
  connected. A failure names the vertex and the cut: the set reached, whose boundary toward the
  vertex has capacity 0 (every declared link has positive capacity, so no arc crosses it).

>>> p = load_program('''
... topology t { node g[0..2]  g[0..2] <-> g[0..2] : 10 GB/s, 1 us }
... collective b = broadcast on t { size = 1 MB }''')
>>> len(p.topologies["t"].links), p.collectives[0].ranks, p.collectives[0].root
(6, ('g0', 'g1', 'g2'), 0)
"""
from __future__ import annotations

import difflib
import os
from fractions import Fraction
from pathlib import Path

from ..grammar import ast
from ..grammar.diagnostics import Source, SourceError, Span
from ..grammar.limits import (
    MAX_BANDWIDTH,
    MAX_BYTES,
    MAX_HOSTS,
    MAX_LATENCY,
    MAX_LINKS,
    MAX_RANGE,
    MAX_VERTICES,
    MIN_BANDWIDTH,
)
from ..grammar.parser import MAX_SOURCE_CHARS, parse
from ..ir.errors import ArgumentTypeError
from ..ir.plan import DTYPE_SIZES, FLOAT_DTYPES, KINDS, OPS, PEERS, REDUCING_KINDS, ROOTED_KINDS
from ..ir.topology import Link, Topology, reach
from .program import CollectiveSpec, Program
from .units import convert

ALGORITHMS = ("auto", "treepack", "ring", "tree", "direct")
# the compiler's other forms, forced by their registry names (compiler/registry.py) with '_'
# for '-', which a name cannot hold; each only for the kinds it schedules
NAMED_FORMS = ("rings", "rd", "treepack_levels", "treepack_rsag", "treepack_split", "treepack_bidir",
               "treepack_rings", "treepack_hier", "treepack_dbt", "treepack_wide", "treepack_ringfill",
               "rounds", "replay")
COMPRESSIONS = ("none", "fp16", "int8")
ON_FAILURE = ("abort", "continue")
ADAPTIVE = ("on", "off")
KEYS = ("ranks", "root", "size", "dtype", "op", "algorithm", "chunk", "compress",
        "on_failure", "adaptive", "peers")

# Limits (docs/language.md "Limits"; the table and its reasons: grammar/limits.py), checked on
# counts *before* anything is expanded, so a hostile or mistyped file (`host h[0..65535] {
# node g[0..65535] }`, a clique over 65536 vertices: 4e9 names or arcs) is refused with a
# caret in microseconds instead of exhausting memory. Each message states the limit.
MAX_LINKS_PER_STATEMENT = MAX_LINKS


def load_program(path_or_source: str | os.PathLike) -> Program:
    """Parse and check a program: a PathLike or a str naming an existing file is read;
    any other str is source text with path ``"<string>"``.

    Raises :class:`SourceError` for every fault of language.md "Errors", and
    :class:`~hcc.ir.errors.ArgumentTypeError` for an argument that is neither."""
    if not isinstance(path_or_source, (str, os.PathLike)):
        raise ArgumentTypeError(f"hcc.load: expected a path or the program's source text (str or "
                                f"os.PathLike), got {type(path_or_source).__name__}")
    if isinstance(path_or_source, os.PathLike) or _names_a_file(path_or_source):
        path = os.fspath(path_or_source)
        text = read_source(path)
    else:
        path, text = "<string>", str(path_or_source)
    return check_module(parse(text, path))


def read_source(path: str) -> str:
    """The text of the program file ``path``: at most MAX_SOURCE_CHARS bytes, UTF-8 (a
    leading byte-order mark is skipped). A file that is not UTF-8 (a binary file, a Latin-1
    one) is refused at its first bad byte with line, column and caret."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_CHARS + 1)
    except OSError as e:
        raise UnreadableSource(path, f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_SOURCE_CHARS:
        raise UnreadableSource(path, f"cannot read {path}: larger than {MAX_SOURCE_CHARS} bytes "
                                     "(16 MiB), the limit for a program")
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        before = _newlines(data[bom:bom + e.start].decode("utf-8"))  # valid up to the bad byte
        line = before.count("\n") + 1
        col = len(before) - (before.rfind("\n") + 1) + 1
        shown = _newlines(data[bom:].decode("utf-8", errors="replace"))
        bad = data[bom + e.start]
        raise SourceError(
            Span(Source(path, shown), line, col),
            f"not UTF-8 text: byte 0x{bad:02x} at byte offset {bom + e.start} {_why_bad(e)}"
            + (" (a binary file?)" if b"\0" in data[:4096] or bad < 0x20 else ""),
            hint="HCL files are UTF-8; re-save the file as UTF-8",
        ) from None


def _newlines(text: str) -> str:
    """``\r\n`` and a lone ``\r`` as ``\n``, as the parser counts lines (grammar/parser.py)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _why_bad(e: UnicodeDecodeError) -> str:
    return {"invalid start byte": "cannot start a character",
            "invalid continuation byte": "starts a sequence that is not valid UTF-8",
            "unexpected end of data": "ends the file inside a character"}.get(e.reason, f"({e.reason})")


class UnreadableSource(SourceError):
    """The program file cannot be read (missing, a directory, not UTF-8). Bad input, so the
    CLI exits 2 as for any SourceError; it renders without a source line, having none."""

    def __init__(self, path: str, message: str):
        super().__init__(Span(Source(path, ""), 1, 1), message)

    def render(self) -> str:
        return f"{self.span.path}: error: {self.message}"


def _names_a_file(s: str) -> bool:
    """Source text always has whitespace (``topology t {``); a single word is a path, so a
    mistyped file name gets "cannot read", not a syntax error about the name."""
    if not isinstance(s, str) or "\n" in s:
        return False
    return os.path.exists(s) or (bool(s) and not any(ch.isspace() for ch in s))


def check_module(module: ast.Module) -> Program:
    """The checked :class:`Program` of a parsed module (every check of language.md)."""
    topos: dict[str, _TopologyBuilder] = {}
    for t in module.topologies:
        if t.name in topos:
            _duplicate(t.name_span, "topology", t.name, topos[t.name].decl.name_span)
        topos[t.name] = _TopologyBuilder(t)
    for b in topos.values():
        b.build()
    specs: list[CollectiveSpec] = []
    seen: dict[str, Span] = {}
    for c in module.collectives:
        if c.name in seen:
            _duplicate(c.name_span, "collective", c.name, seen[c.name])
        seen[c.name] = c.name_span
        specs.append(_CollectiveChecker(c, topos).check())
    return Program(
        path=module.source.path,
        topologies={name: b.topology for name, b in topos.items()},
        collectives=tuple(specs),
    )


# ---- shared helpers ----------------------------------------------------------------------

def _a(word: str) -> str:
    """``"allgather"`` -> ``"an allgather"``."""
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _at(span: Span) -> str:
    return f"line {span.line}, column {span.col}"


def _duplicate(span: Span, what: str, name: str, first: Span) -> None:
    raise SourceError(span, f"duplicate {what} name '{name}' (first declared at {_at(first)})")


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _set_text(names, limit: int = 12) -> str:
    names = list(names)
    if len(names) > limit:
        return "{" + ", ".join(names[:limit]) + f", … ({len(names)} vertices)" + "}"
    return "{" + ", ".join(names) + "}"


def _part_size(part: ast.Part) -> int:
    """How many names ``part`` expands to, without expanding it (refused past MAX_RANGE)."""
    if part.indices is None:
        return 1
    n = 0
    for ix in part.indices:
        if ix.lo > ix.hi:
            raise SourceError(
                ix.span,
                f"bad range {ix.lo}..{ix.hi}: the first bound is larger than the second",
                hint=f"ranges count up: write {part.name}[{ix.hi}..{ix.lo}]",
            )
        n += ix.hi - ix.lo + 1
        if n > MAX_RANGE:
            raise SourceError(ix.span, f"range too large: {part.text()} names more than {MAX_RANGE} "
                                       f"names (the limit per range)")
    return n


def _ref_size(ref: ast.Ref) -> int:
    """How many names ``ref`` expands to (hosts × vertices), refused past MAX_VERTICES."""
    n = _part_size(ref.vertex) * (1 if ref.host is None else _part_size(ref.host))
    if n > MAX_VERTICES:
        raise SourceError(ref.span, f"{ref.text()} names {n} vertices; a topology has at most "
                                    f"{MAX_VERTICES}")
    return n


def _expand_part(part: ast.Part) -> list[tuple[str, Span]]:
    """``gpu[0,3..4]`` -> ``[("gpu0", span of 0), ("gpu3", span of 3..4), ("gpu4", …)]``:
    each name with the span of the index item that made it (the whole part when plain)."""
    if part.indices is None:
        return [(part.name, part.span)]
    _part_size(part)
    out: list[tuple[str, Span]] = []
    for ix in part.indices:
        out.extend((f"{part.name}{i}", ix.span) for i in range(ix.lo, ix.hi + 1))
    return out


def _expand_ref(ref: ast.Ref) -> list[tuple[str, Span]]:
    """Names as written (qualified when the ref is), before host-local resolution, each with
    the span to blame for it: its index item in a range, else the whole reference."""
    _ref_size(ref)
    vs = _expand_part(ref.vertex)
    if ref.host is None:
        return vs if ref.vertex.indices is not None else [(ref.vertex.name, ref.span)]
    out = []
    for h, hspan in _expand_part(ref.host):
        for v, vspan in vs:
            span = vspan if ref.vertex.indices is not None else (
                hspan if ref.host.indices is not None else ref.span)
            out.append((f"{h}.{v}", span))
    return out


def _positive_exact(q: ast.Quantity, family: str, what: str) -> Fraction:
    v = convert(q, family)
    if v <= 0:
        raise SourceError(q.number_span, f"{what} must be positive, got {q.text()}")
    return v


def _bandwidth(q: ast.Quantity, mult: int = 1, mult_span: Span | None = None) -> Fraction:
    """A link's bandwidth in B/s, times its multiplicity, inside the limits."""
    bw = _positive_exact(q, "bandwidth", "a link bandwidth")
    if bw < MIN_BANDWIDTH:
        raise SourceError(q.number_span, f"a link bandwidth of {q.text()} is below the limit of 1 B/s")
    if bw * mult > MAX_BANDWIDTH:
        shown = q.text() + (f" x{mult}" if mult != 1 else "")
        raise SourceError(mult_span if mult != 1 and bw <= MAX_BANDWIDTH else q.number_span,
                          f"a link bandwidth of {shown} is above the limit of 10^18 B/s (1000000 TB/s)")
    return bw * mult


def _latency(q: ast.Quantity) -> Fraction:
    lat = convert(q, "time")
    if lat < 0:
        raise SourceError(q.number_span, f"latency cannot be negative, got {q.text()}")
    if lat > MAX_LATENCY:
        raise SourceError(q.number_span, f"latency {q.text()} is above the limit of 3600 s")
    return lat


# ---- topology ----------------------------------------------------------------------------

class _TopologyBuilder:
    """Two passes over one ``topology`` block: declarations (vertices, classes, hosts) first,
    then links, so a link may name a vertex or class declared further down."""

    def __init__(self, decl: ast.TopologyDecl):
        self.decl = decl
        self.name = decl.name
        self.kind: dict[str, str] = {}  # vertex -> "node" | "switch", in declaration order
        self.declared_at: dict[str, Span] = {}
        self.host_of: dict[str, str] = {}
        self.hosts: dict[str, Span] = {}
        self.classes: dict[str, tuple[Fraction, Fraction, Span]] = {}
        self.links: list[Link] = []
        self.topology: Topology | None = None

    # -- pass 1
    def _room(self, span: Span, adding: int, what: str) -> None:
        """Refuse a declaration that would take the topology past MAX_VERTICES, counted
        before a name is made."""
        if len(self.kind) + adding > MAX_VERTICES:
            raise SourceError(span, f"{what} declares {adding} vertices, {len(self.kind) + adding} in "
                                    f"topology {self.name}; a topology has at most {MAX_VERTICES}")

    def build(self) -> Topology:
        for stmt in self.decl.body:
            if isinstance(stmt, ast.Decl):
                self._room(stmt.span, sum(_ref_size(r) for r in stmt.refs), "this declaration")
                self._declare(stmt, None)
            elif isinstance(stmt, ast.ClassDecl):
                self._class(stmt)
            elif isinstance(stmt, ast.Host):
                n_hosts = _part_size(stmt.part)
                if len(self.hosts) + n_hosts > MAX_HOSTS:
                    raise SourceError(stmt.part.span, f"{len(self.hosts) + n_hosts} hosts in topology "
                                                      f"{self.name}; a topology has at most {MAX_HOSTS}")
                per_host = sum(_ref_size(r) for s in stmt.body if isinstance(s, ast.Decl) for r in s.refs)
                self._room(stmt.part.span, n_hosts * per_host,
                           f"host {stmt.part.text()} ({n_hosts} × {per_host})")
                for h, _ in _expand_part(stmt.part):
                    if h in self.hosts:
                        _duplicate(stmt.part.span, "host", h, self.hosts[h])
                    self.hosts[h] = stmt.part.span
                    for s in stmt.body:
                        if isinstance(s, ast.Decl):
                            self._declare(s, h)
        # -- pass 2
        for stmt in self.decl.body:
            if isinstance(stmt, ast.Link):
                self._link(stmt, None)
            elif isinstance(stmt, ast.Host):
                for h, _ in _expand_part(stmt.part):
                    for s in stmt.body:
                        if isinstance(s, ast.Link):
                            self._link(s, h)
        nodes = tuple(v for v, k in self.kind.items() if k == "node")
        switches = tuple(v for v, k in self.kind.items() if k == "switch")
        self.topology = Topology(
            name=self.name,
            nodes=nodes,
            switches=switches,
            links=tuple(self.links),
            hosts=tuple((v, h) for v, h in self.host_of.items()),
        )
        return self.topology

    def _declare(self, d: ast.Decl, host: str | None) -> None:
        for ref in d.refs:
            if ref.host is not None:
                raise SourceError(
                    ref.span,
                    f"cannot declare the qualified name '{ref.text()}' here; "
                    "declare it inside its host block",
                    hint=f"host {ref.host.text()} {{ {d.kind} {ref.vertex.text()} }}",
                )
            for v, vspan in _expand_part(ref.vertex):
                name = f"{host}.{v}" if host else v
                if name in self.kind:
                    raise SourceError(
                        vspan if ref.vertex.indices is not None else ref.span,
                        f"duplicate vertex name '{name}' (first declared at "
                        f"{_at(self.declared_at[name])})",
                    )
                self.kind[name] = d.kind
                self.declared_at[name] = ref.span
                if host:
                    self.host_of[name] = host

    def _class(self, c: ast.ClassDecl) -> None:
        if c.name in self.classes:
            _duplicate(c.name_span, "link class", c.name, self.classes[c.name][2])
        bw = _bandwidth(c.bandwidth)
        lat = Fraction(0) if c.latency is None else _latency(c.latency)
        self.classes[c.name] = (bw, lat, c.name_span)

    # -- references
    def resolve(self, ref: ast.Ref, host: str | None = None) -> list[str]:
        """The declared vertices ``ref`` names, each once, in order."""
        return list(dict.fromkeys(v for v, _ in self.resolve_spans(ref, host)))

    def resolve_spans(self, ref: ast.Ref, host: str | None = None) -> list[tuple[str, Span]]:
        """The declared vertices ``ref`` names, with the span of the item that named each.
        Inside a host a plain name is the host's own vertex first, else a top-level one.
        Unknown names raise with a did-you-mean."""
        out: list[tuple[str, Span]] = []
        for raw, span in _expand_ref(ref):
            cands = [f"{host}.{raw}", raw] if host and ref.host is None else [raw]
            for c in cands:
                if c in self.kind:
                    out.append((c, span))
                    break
            else:
                if host and ref.host is None:
                    pool = [v.split(".", 1)[1] for v in self.kind if self.host_of.get(v) == host]
                    pool += [v for v in self.kind if "." not in v]
                else:
                    pool = list(self.kind)
                origin = "" if ref.is_single else f" (from {ref.text()})"
                raise SourceError(
                    span,
                    f"unknown vertex '{raw}'{origin} in topology {self.name}{_did_you_mean(raw, pool)}",
                )
        return out

    # -- pass 2
    def _link(self, l: ast.Link, host: str | None) -> None:
        srcs = self.resolve(l.src, host)
        dsts = self.resolve(l.dst, host)
        spec = l.spec
        mult = 1 if spec.mult is None else spec.mult
        if mult < 1:
            raise SourceError(spec.mult_span, f"link multiplicity must be at least 1, got x{spec.mult}")
        if isinstance(spec.bandwidth, ast.ClassRef):
            cref = spec.bandwidth
            if cref.name not in self.classes:
                raise SourceError(
                    cref.span,
                    f"unknown link class '{cref.name}'{_did_you_mean(cref.name, self.classes)}",
                    hint="declare it with: class NAME = BANDWIDTH, LATENCY"
                    if not self.classes else "classes: " + ", ".join(self.classes),
                )
            bw, lat, _ = self.classes[cref.name]
            if bw * mult > MAX_BANDWIDTH:
                raise SourceError(spec.mult_span, f"a link bandwidth of {cref.name} x{mult} is above "
                                                  "the limit of 10^18 B/s (1000000 TB/s)")
            bw *= mult
        else:
            bw = _bandwidth(spec.bandwidth, mult, spec.mult_span)
            lat = Fraction(0)
        if spec.latency is not None:
            lat = _latency(spec.latency)
        # count the arcs before making them: S×D ordered pairs less the self-pairs (one per
        # vertex on both sides); `<->` makes an arc each way per unordered pair, and a pair
        # with both ends on both sides is met twice in S×D
        both = len(set(srcs) & set(dsts))
        ordered = len(srcs) * len(dsts) - both
        arcs = ordered if l.arrow == "->" else 2 * (ordered - both * (both - 1) // 2)
        if arcs == 0:
            raise SourceError(l.dst.span, f"a link from '{srcs[0]}' to itself")
        if len(self.links) + arcs > MAX_LINKS:
            raise SourceError(l.span, f"this statement makes {arcs} links, {len(self.links) + arcs} in "
                                      f"topology {self.name}; a topology has at most {MAX_LINKS}")
        pairs = [(a, b) for a in srcs for b in dsts if a != b]
        cap, latency = float(bw), float(lat)
        if l.arrow == "->":
            for a, b in pairs:
                self.links.append(Link(a, b, cap, latency))
        else:
            done: set[frozenset] = set()
            for a, b in pairs:
                key = frozenset((a, b))
                if key in done:
                    continue
                done.add(key)
                self.links.append(Link(a, b, cap, latency))
                self.links.append(Link(b, a, cap, latency))


# ---- collectives -------------------------------------------------------------------------

class _CollectiveChecker:
    def __init__(self, c: ast.CollectiveDecl, topos: dict[str, _TopologyBuilder]):
        self.c = c
        self.topos = topos

    def check(self) -> CollectiveSpec:
        c = self.c
        if c.topology not in self.topos:
            known = ", ".join(self.topos) or "none declared"
            raise SourceError(
                c.topology_span,
                f"unknown topology '{c.topology}'{_did_you_mean(c.topology, self.topos)}",
                hint=f"topologies: {known}",
            )
        if c.kind not in KINDS:
            raise SourceError(
                c.kind_span,
                f"unknown collective kind '{c.kind}'{_did_you_mean(c.kind, KINDS)}",
                hint="kinds: " + " ".join(KINDS),
            )
        self.topo = self.topos[c.topology]
        self.kind = c.kind
        self.settings: dict[str, ast.Setting] = {}
        for s in c.settings:
            if s.key in self.settings:
                raise SourceError(
                    s.key_span,
                    f"duplicate key '{s.key}' in collective {c.name} "
                    f"(first set at {_at(self.settings[s.key].key_span)})",
                )
            if s.key not in KEYS:
                raise SourceError(
                    s.key_span,
                    f"unknown key '{s.key}'{_did_you_mean(s.key, KEYS)}",
                    hint="keys: " + " ".join(KEYS),
                )
            self.settings[s.key] = s

        dtype = self._word("dtype", tuple(DTYPE_SIZES), "dtype") or "float32"
        algorithm = self._word("algorithm", ALGORITHMS + NAMED_FORMS, "algorithm") or "auto"
        compress = self._word("compress", COMPRESSIONS, "compression") or "none"
        on_failure = self._word("on_failure", ON_FAILURE, "on_failure value") or "abort"
        adaptive_word = self._word("adaptive", ADAPTIVE, "adaptive value")
        op = self._word("op", OPS, "op")
        peers = self._word("peers", PEERS, "peers value")
        ranks, rank_spans = self._ranks()
        root = self._root(ranks)
        size = self._size(dtype, len(ranks))
        chunk = self._chunk(dtype)
        op = self._check_op(op, dtype)
        peers = self._check_peers(peers, len(ranks))
        self._check_float(dtype, compress)
        self._check_reachable(ranks, root, rank_spans)
        spec = CollectiveSpec(
            name=c.name,
            kind=self.kind,
            topology=c.topology,
            ranks=tuple(ranks),
            root=root,
            size_bytes=size,
            dtype=dtype,
            op=op,
            algorithm=algorithm.replace("_", "-"),
            chunk_bytes=chunk,
            compress=compress,
            on_failure=on_failure,
            adaptive=None if adaptive_word is None else adaptive_word == "on",
            peers=peers,
            span=c.span,
        )
        if algorithm in NAMED_FORMS:
            self._check_form(algorithm, spec)
        return spec

    def _check_form(self, word: str, spec: CollectiveSpec) -> None:
        """A form of NAMED_FORMS must schedule the collective's kind and take its ranks
        (registry.Algorithm ``kinds`` and ``eligible``), else an error at the value."""
        from .registry import BY_NAME  # loaded only where a form is named

        form = BY_NAME[spec.algorithm]
        if spec.kind not in form.kinds:
            why = f"does not schedule {spec.kind} (it schedules {', '.join(sorted(form.kinds))})"
        elif not form.eligible(spec):
            why = f"does not take {spec.kind} over {len(spec.ranks)} ranks"
        else:
            return
        raise SourceError(self.settings["algorithm"].value_span, f"algorithm {word} {why}",
                          hint="algorithm = auto picks among every form that applies")

    # -- values

    def _word(self, key: str, choices: tuple[str, ...], what: str) -> str | None:
        s = self.settings.get(key)
        if s is None:
            return None
        listed = " | ".join(choices)
        if isinstance(s.value, ast.Quantity) or len(s.value) != 1 or not s.value[0].is_plain_name:
            shown = s.value.text() if isinstance(s.value, ast.Quantity) else ", ".join(r.text() for r in s.value)
            raise SourceError(s.value_span, f"expected a {what} ({listed}), got '{shown}'")
        word = s.value[0].vertex.name
        if word not in choices:
            raise SourceError(
                s.value_span,
                f"unknown {what} '{word}'{_did_you_mean(word, choices)}",
                hint=f"{key} = {listed}",
            )
        return word

    def _refs(self, key: str, what: str) -> tuple[ast.Ref, ...] | None:
        s = self.settings.get(key)
        if s is None:
            return None
        if isinstance(s.value, ast.Quantity):
            raise SourceError(s.value_span, f"expected {what}, got '{s.value.text()}'")
        return s.value

    def _quantity(self, key: str, family: str) -> ast.Quantity | None:
        s = self.settings.get(key)
        if s is None:
            return None
        if not isinstance(s.value, ast.Quantity):
            shown = ", ".join(r.text() for r in s.value)
            if key == "chunk" and shown == "auto":
                return None
            raise SourceError(s.value_span, f"expected a {family} like 256 MB, got '{shown}'"
                              + ("" if key != "chunk" else " (or auto)"))
        return s.value

    # -- ranks and root
    def _vertex_problem(self, v: str, span: Span, role: str) -> None:
        if self.topo.kind[v] == "switch":
            raise SourceError(
                span,
                f"'{v}' is a switch and cannot be {role}: switches only forward, they never own data",
            )

    def _ranks(self) -> tuple[list[str], dict[str, Span]]:
        refs = self._refs("ranks", "a list of vertices like gpu[0..3]")
        kind_name = self.kind
        if refs is None:
            ranks = [v for v, k in self.topo.kind.items() if k == "node"]
            spans = {v: self.c.name_span for v in ranks}
            if len(ranks) < 2:
                raise SourceError(
                    self.c.name_span,
                    f"{_a(kind_name)} needs at least 2 ranks; topology {self.topo.name} has "
                    f"{len(ranks)} node{'s' if len(ranks) != 1 else ''}",
                )
            return ranks, spans
        ranks: list[str] = []
        spans: dict[str, Span] = {}
        for ref in refs:
            for v, span in self.topo.resolve_spans(ref):
                self._vertex_problem(v, span, "a rank")
                if v in spans:
                    raise SourceError(span, f"rank '{v}' is listed twice (first at {_at(spans[v])})")
                ranks.append(v)
                spans[v] = span
        if len(ranks) < 2:
            raise SourceError(
                self.settings["ranks"].value_span,
                f"{_a(kind_name)} needs at least 2 ranks; got {len(ranks)} ({', '.join(ranks)})",
            )
        return ranks, spans

    def _root(self, ranks: list[str]) -> int:
        s = self.settings.get("root")
        if self.kind not in ROOTED_KINDS:
            if s is not None:
                raise SourceError(
                    s.key_span,
                    f"'root' applies only to rooted kinds ({', '.join(sorted(ROOTED_KINDS))}); "
                    f"{self.kind} has no root",
                )
            return -1
        if s is None:
            return 0
        refs = self._refs("root", "one vertex")
        if len(refs) != 1 or not refs[0].is_single:
            raise SourceError(s.value_span, "the root is one vertex, not a list or a range")
        v = self.topo.resolve(refs[0])[0]
        self._vertex_problem(v, refs[0].span, "the root")
        if v not in ranks:
            raise SourceError(
                s.value_span,
                f"root '{v}' is not one of the ranks {_set_text(ranks)}",
            )
        return ranks.index(v)

    # -- sizes
    def _bytes(self, q: ast.Quantity, what: str) -> int:
        v = convert(q, "size")
        if v.denominator != 1:
            raise SourceError(q.span, f"{what} {q.text()} is not a whole number of bytes")
        if v <= 0:
            raise SourceError(q.number_span, f"{what} must be positive, got {q.text()}")
        if v > MAX_BYTES:
            raise SourceError(q.number_span, f"{what} {q.text()} is above the limit of 2^50 B (1024 TiB)")
        return int(v)

    def _size(self, dtype: str, n: int) -> int:
        q = self._quantity("size", "size")
        if q is None:
            raise SourceError(
                self.c.name_span,
                f"collective {self.c.name} has no size",
                hint="add e.g.: size = 64 MB",
            )
        size = self._whole_elements(q, "size", dtype)
        esize = DTYPE_SIZES[dtype]
        if self.kind == "alltoall" and size % (n * esize):
            raise SourceError(
                q.span,
                f"an alltoall size must be a multiple of ranks × {dtype} size = {n} × {esize} B "
                f"= {n * esize} B (every rank sends an equal block to each rank); got {size} B",
            )
        return size

    def _chunk(self, dtype: str) -> int | None:
        q = self._quantity("chunk", "size")
        if q is None:
            return None
        return self._whole_elements(q, "chunk", dtype)

    def _whole_elements(self, q, what: str, dtype: str) -> int:
        """``q`` in bytes, refused unless it is a whole number of ``dtype`` elements."""
        nbytes = self._bytes(q, what)
        esize = DTYPE_SIZES[dtype]
        if nbytes % esize:
            raise SourceError(
                q.span,
                f"{what} {q.text()} ({nbytes} B) is not a multiple of the {dtype} element size ({esize} B)",
            )
        return nbytes

    # -- kind-specific keys
    def _check_op(self, op: str | None, dtype: str) -> str | None:
        s = self.settings.get("op")
        if self.kind not in REDUCING_KINDS:
            if s is not None:
                why = ("neighbor_average always takes the mean" if self.kind == "neighbor_average"
                       else f"{self.kind} does not reduce")
                raise SourceError(
                    s.key_span,
                    f"'op' applies only to reducing kinds ({', '.join(sorted(REDUCING_KINDS))}); {why}",
                )
            return None
        if op == "avg" and dtype not in FLOAT_DTYPES:
            raise SourceError(
                s.value_span,
                f"op = avg needs a floating-point dtype; dtype is {dtype}",
                hint="dtype = " + " | ".join(sorted(FLOAT_DTYPES)),
            )
        return op or "sum"

    def _check_peers(self, peers: str | None, n: int) -> str | None:
        s = self.settings.get("peers")
        if self.kind != "neighbor_average":
            if s is not None:
                raise SourceError(s.key_span, f"'peers' applies only to neighbor_average, not {self.kind}")
            return None
        if peers == "shift_one" and n % 2:
            raise SourceError(
                s.value_span,
                f"peers = shift_one pairs the two halves of the ranks and needs an even rank count; got {n}",
            )
        return peers or "ring"

    def _check_float(self, dtype: str, compress: str) -> None:
        if dtype in FLOAT_DTYPES:
            return
        if self.kind == "neighbor_average":
            s = self.settings["dtype"]  # the default dtype is float32, so it was written
            raise SourceError(
                s.value_span,
                f"neighbor_average takes a mean and needs a floating-point dtype; got {dtype}",
            )
        if compress != "none":
            s = self.settings["compress"]
            raise SourceError(
                s.value_span,
                f"compress = {compress} is a lossy float encoding and needs a floating-point dtype; "
                f"dtype is {dtype}",
            )

    # -- connectivity
    def _check_reachable(self, ranks: list[str], root: int, spans: dict[str, Span]) -> None:
        sub = self.topo.topology.restricted(tuple(ranks))
        out: dict[str, list[str]] = {v: [] for v in sub.vertices}
        inn: dict[str, list[str]] = {v: [] for v in sub.vertices}
        for l in sub.links:
            out[l.src].append(l.dst)
            inn[l.dst].append(l.src)
        order = {v: i for i, v in enumerate(self.topo.kind)}

        def fail(v: str, start: str, forward: bool, reached: set[str], lead: str) -> None:
            shown = _set_text(sorted(reached, key=order.__getitem__))
            if forward:
                cut = (f"the vertices reachable from '{start}' are {shown}, and no link leaves that "
                       f"set toward '{v}' (the cut has capacity 0)")
            else:
                cut = (f"the vertices that can reach '{start}' are {shown}, and no link enters that "
                       f"set from '{v}' (the cut has capacity 0)")
            blocked = sorted(
                {(l.dst if forward else l.src) for l in self.topo.topology.links
                 if (l.src in reached) == forward and (l.dst in reached) != forward
                 and (l.dst if forward else l.src) not in sub.vertices},
                key=order.__getitem__,
            )
            hint = ""
            if blocked:
                hint = (f"links through {', '.join(blocked)} do not count: "
                        f"{'it is not a rank' if len(blocked) == 1 else 'they are not ranks'} of this collective")
            raise SourceError(spans[v], f"{lead} over this collective's ranks and switches: {cut}", hint)

        def check(start: str, forward: bool, lead) -> None:
            reached = reach(out if forward else inn, start)
            for v in ranks:
                if v not in reached:
                    fail(v, start, forward, reached, lead(v))

        if self.kind in ROOTED_KINDS:
            r = ranks[root]
            if self.kind in ("broadcast", "scatter"):
                check(r, True, lambda v: f"rank '{v}' cannot be reached from the root '{r}'")
            else:
                check(r, False, lambda v: f"rank '{v}' cannot reach the root '{r}'")
        else:
            r = ranks[0]
            what = f"{_a(self.kind)} needs its ranks strongly connected"
            check(r, True, lambda v: f"{what}: '{v}' cannot be reached from '{r}'")
            check(r, False, lambda v: f"{what}: '{v}' cannot reach '{r}'")
