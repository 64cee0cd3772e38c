"""hcc.ir.serialize — the plan file (``plan.json``): versioned JSON, documented in
docs/plan-format.md.

Terms
- plan file: one JSON object ``{"format": "hcc-plan", "version": 1, ...}`` holding every
  field of a :class:`~hcc.ir.plan.Plan`. Ops are compact arrays (an opcode, fixed fields, then
  the deps), so a 100k-op plan is a few MB rather than tens.
- canonical JSON: the plan's object without ``figures``, keys sorted, no whitespace. Its
  sha256 (first 16 hex digits) is :func:`digest`, the plan id frames on the wire carry.
  Figures (compile time, predictions) are excluded so that two compiles of one program, which
  differ only in their measured compile time, name the same schedule.

Every way a file can be wrong (not JSON, truncated, another format or version, a missing or
mistyped field, an op that does not decode, a plan that fails :func:`~hcc.ir.verify.verify`)
raises :class:`~hcc.ir.errors.PlanError` whose text starts ``<file>: error:``.

Numbers are held to the language's limits (grammar/limits.py, docs/language.md "Limits") as
they are read: NaN and infinities are refused by the JSON reader itself, an integer of more
than 19 digits before it is converted, and the topology's numbers (a capacity of 0 divides by
zero in every time computed from it, a negative latency makes shortest-path routing cycle
forever) before any stage uses them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from typing import Any

from ..grammar.limits import (
    MAX_BANDWIDTH,
    MAX_BYTES,
    MAX_LATENCY,
    MAX_LINKS,
    MAX_VERTICES,
    MIN_BANDWIDTH,
)

from .errors import ArgumentTypeError, PlanError, VerifyError
from .files import atomic_write_text
from .plan import PLAN_VERSION, Figures, Plan, Tree
from .plan import ChunkRef, Copy, Recv, RecvReduce, Reduce, Scale, Send
from .topology import Link, Topology

FORMAT = "hcc-plan"
BUF_CODES = ("in", "out", "tmp")  # buffer code = index here
# opcode = index here; the order is part of format version 1 (docs/plan-format.md)
OPCODES = ("send", "recv", "recv_reduce", "copy", "reduce", "scale", "copy_roundtrip")
_MSG_TYPES = (Send, Recv, RecvReduce)

__all__ = ["FORMAT", "digest", "dumps", "load", "loads", "save", "summary", "to_dict", "topology_from_dict"]

# 19 digits: every integer a plan holds (offsets, counts, tags, sizes) fits in 64 bits; a
# longer one is refused before Python converts it (past 4300 digits Python itself refuses,
# with a ValueError that is not a JSON error).
MAX_INT_DIGITS = 19
MAX_FLOAT_CHARS = 64  # "-1.7976931348623157e+308" is 24


# -- encoding --------------------------------------------------------------------------------
def _buf(ref: ChunkRef) -> int:
    try:
        return BUF_CODES.index(ref.buf)
    except ValueError:
        raise PlanError(f"cannot write buffer {ref.buf!r} (expected one of {', '.join(BUF_CODES)})") from None


def _encode_op(op: Any) -> list:
    t = type(op)
    if t in _MSG_TYPES:
        ref = op.src if t is Send else op.dst
        return [_MSG_TYPES.index(t), op.peer, op.tag, _buf(ref), ref.offset, ref.count,
                op.tree, op.chunk, *op.deps]
    if t is Copy or t is Reduce:
        if op.src.count != op.dst.count:
            raise PlanError(f"cannot write {t.__name__.lower()} with unequal counts ({op.src.count}, {op.dst.count})")
        code = (6 if getattr(op, "roundtrip", False) else 3) if t is Copy else 4
        return [code, _buf(op.src), op.src.offset, _buf(op.dst), op.dst.offset,
                op.src.count, *op.deps]
    if t is Scale:
        return [5, _buf(op.dst), op.dst.offset, op.dst.count, op.divisor, *op.deps]
    raise PlanError(f"cannot write {op!r}: not a plan op")


def to_dict(plan: Plan, figures: bool = True) -> dict:
    """The plan as the JSON object of format version 1 (ops encoded, topology as a dict)."""
    d: dict[str, Any] = {
        "format": FORMAT,
        "version": PLAN_VERSION,
        "name": plan.name,
        "kind": plan.kind,
        "ranks": list(plan.ranks),
        "root": plan.root,
        "size_bytes": plan.size_bytes,
        "dtype": plan.dtype,
        "op": plan.op,
        "algorithm": plan.algorithm,
        "chunk_bytes": plan.chunk_bytes,
        "compress": plan.compress,
        "on_failure": plan.on_failure,
        "adaptive": plan.adaptive,
        "peers": plan.peers,
        "tmp_elems": list(plan.tmp_elems),
        "topology": plan.topology.to_dict(),
        "trees": [
            {"index": t.index, "root": t.root, "parent": list(t.parent), "rate": t.rate,
             "span": list(t.span), "paths": [list(p) for p in t.paths]}
            for t in plan.trees
        ],
    }
    if figures:
        d["figures"] = dataclasses.asdict(plan.figures)
    d["programs"] = [[_encode_op(op) for op in prog] for prog in plan.programs]
    if plan.step_programs:  # only where present: every other plan's file and digest unchanged
        d["step_programs"] = [[[_encode_op(op) for op in prog] for prog in progs] for progs in plan.step_programs]
    return d


def dumps(plan: Plan) -> str:
    """The plan file's text: one top-level field per line, one line per tree and per rank's
    program (compact JSON inside each line)."""
    def compact(v: Any) -> str:
        return json.dumps(v, separators=(",", ":"), allow_nan=False)

    fields = []
    for key, v in to_dict(plan).items():
        if key in ("trees", "programs", "step_programs") and v:
            inner = ",\n".join("  " + compact(x) for x in v)
            fields.append(f' "{key}": [\n{inner}\n ]')
        else:
            fields.append(f' "{key}": {compact(v)}')
    return "{\n" + ",\n".join(fields) + "\n}\n"


def digest(plan: Plan) -> str:
    """sha256 of the canonical JSON (figures excluded), first 16 hex digits."""
    text = json.dumps(to_dict(plan, figures=False), sort_keys=True, separators=(",", ":"),
                      allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def save(plan: Plan, path: str | os.PathLike) -> None:
    """Write the plan file atomically (ir/files.py): a failure leaves ``path`` untouched."""
    atomic_write_text(path, dumps(plan))


# -- decoding --------------------------------------------------------------------------------
class _Reader:
    """Typed field access that names the offending field in its error."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, msg: str) -> PlanError:
        return PlanError(msg, self.source)

    def get(self, d: dict, key: str, kinds: tuple, where: str = "", optional: bool = False,
            default: Any = None) -> Any:
        if key not in d:
            if optional:
                return default
            raise self.fail(f"plan file has no field {where + key!r}")
        v = d[key]
        if not _is(v, kinds):
            raise self.fail(f"field {where + key!r} must be {_kinds_text(kinds)}, got {json.dumps(v)[:60]}")
        return v


def _is(v: Any, kinds: tuple) -> bool:
    for k in kinds:
        if k is None and v is None:
            return True
        if k is int and type(v) is int:
            return True
        if k is float and type(v) in (int, float):
            return True
        if k not in (None, int, float) and isinstance(v, k) and not (k is int and isinstance(v, bool)):
            return True
    return False


def _kinds_text(kinds: tuple) -> str:
    names = {None: "null", int: "an integer", float: "a number", str: "a string", bool: "a boolean",
             list: "a list", dict: "an object"}
    return " or ".join(names.get(k, str(k)) for k in kinds)


def _ints(rd: _Reader, v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not all(type(x) is int for x in v):
        raise rd.fail(f"field {what!r} must be a list of integers")
    return v


def _decode_op(rd: _Reader, a: Any, r: int, i: int, field: str = "programs") -> Any:
    where = f"{field}[{r}][{i}]"
    if not isinstance(a, list) or not a or not all(type(x) is int for x in a):
        raise rd.fail(f"{where}: an op must be a non-empty list of integers, got {json.dumps(a)[:60]}")
    code = a[0]

    def ref(b: int, off: int, cnt: int) -> ChunkRef:
        if not 0 <= b < len(BUF_CODES):
            raise rd.fail(f"{where}: buffer code {b} is not 0 (in), 1 (out) or 2 (tmp)")
        return ChunkRef(BUF_CODES[b], off, cnt)

    if 0 <= code <= 2:
        if len(a) < 8:
            raise rd.fail(f"{where}: a {OPCODES[code]} needs 8 fields before its deps, got {len(a)}")
        _, peer, tag, b, off, cnt, tree, chunk = a[:8]
        cls = _MSG_TYPES[code]
        return cls(peer, tag, ref(b, off, cnt), tuple(a[8:]), tree, chunk)
    if code in (3, 4, 6):
        if len(a) < 6:
            raise rd.fail(f"{where}: a {OPCODES[code]} needs 6 fields before its deps, got {len(a)}")
        _, sb, so, db, do, cnt = a[:6]
        src, dst, deps = ref(sb, so, cnt), ref(db, do, cnt), tuple(a[6:])
        if code == 4:
            return Reduce(src, dst, deps)
        return Copy(src, dst, deps, roundtrip=True) if code == 6 else Copy(src, dst, deps)
    if code == 5:
        if len(a) < 5:
            raise rd.fail(f"{where}: a scale needs 5 fields before its deps, got {len(a)}")
        _, b, off, cnt, div = a[:5]
        return Scale(ref(b, off, cnt), div, tuple(a[5:]))
    raise rd.fail(f"{where}: unknown opcode {code} (expected 0..6: {', '.join(OPCODES)})")


class _Refused(ValueError):
    """A number the JSON reader refuses (raised from its hooks, turned into a PlanError)."""


def _json_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        shown = s if len(s) <= 30 else f"{s[:12]}… ({len(s.lstrip('-'))} digits)"
        raise _Refused(f"integer {shown} is too large: a plan's integers have at most {MAX_INT_DIGITS} digits")
    return int(s)


def _json_float(s: str) -> float:
    v = float(s) if len(s) <= MAX_FLOAT_CHARS else math.inf
    if not math.isfinite(v):
        shown = s if len(s) <= 30 else f"{s[:12]}… ({len(s)} characters)"
        raise _Refused(f"number {shown} is not finite as a float (beyond about 1.8e308)")
    return v


def _json_constant(s: str) -> float:
    raise _Refused(f"{s} is not a number a plan may hold (JSON has no NaN or infinity)")


def _finite(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def topology_from_dict(d: Any, source: str = "<plan>", where: str = "topology") -> Topology:
    """A :class:`Topology` from its JSON object (``Topology.to_dict``), every field checked:
    names are strings, unique, and within the vertex limit; each link joins two distinct
    declared vertices with a capacity in 1 B/s .. 10^18 B/s and a latency in 0 .. 3600 s
    (finite numbers); at most 2^20 links. Raises :class:`PlanError` naming the field."""
    rd = _Reader(source)
    if not isinstance(d, dict):
        raise rd.fail(f"field {where!r} must be an object")
    name = rd.get(d, "name", (str,), where + ".")
    names: dict[str, str] = {}
    for key in ("nodes", "switches"):
        vs = rd.get(d, key, (list,), where + ".", optional=key == "switches", default=[])
        if len(names) + len(vs) > MAX_VERTICES:
            raise rd.fail(f"field '{where}.{key}' makes {len(names) + len(vs)} vertices; "
                          f"a topology has at most {MAX_VERTICES}")
        for i, v in enumerate(vs):
            if not isinstance(v, str) or not v:
                raise rd.fail(f"field '{where}.{key}[{i}]' must be a vertex name, got {json.dumps(v)[:60]}")
            if v in names:
                raise rd.fail(f"field '{where}.{key}[{i}]': vertex {v!r} is declared twice")
            names[v] = key
    links_d = rd.get(d, "links", (list,), where + ".")
    if len(links_d) > MAX_LINKS:
        raise rd.fail(f"field '{where}.links' has {len(links_d)} links; a topology has at most {MAX_LINKS}")
    links = []
    for i, l in enumerate(links_d):
        w = f"{where}.links[{i}]"
        if not (isinstance(l, list) and len(l) == 4 and isinstance(l[0], str) and isinstance(l[1], str)):
            raise rd.fail(f"field '{w}' must be [src, dst, capacity, latency], got {json.dumps(l)[:60]}")
        src, dst, cap, lat = l
        for end in (src, dst):
            if end not in names:
                raise rd.fail(f"field '{w}' names vertex {end!r}, which the topology does not declare")
        if src == dst:
            raise rd.fail(f"field '{w}' is a link from {src!r} to itself")
        if not _finite(cap) or not MIN_BANDWIDTH <= cap <= MAX_BANDWIDTH:
            raise rd.fail(f"field '{w}' capacity {json.dumps(cap)[:40]} is outside 1 .. 10^18 B/s "
                          "(a link needs a positive, finite bandwidth)")
        if not _finite(lat) or not 0 <= lat <= MAX_LATENCY:
            raise rd.fail(f"field '{w}' latency {json.dumps(lat)[:40]} is outside 0 .. 3600 s")
        links.append(Link(src, dst, float(cap), float(lat)))
    hosts = []
    for i, h in enumerate(rd.get(d, "hosts", (list,), where + ".", optional=True, default=[])):
        if not (isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h)) or h[0] not in names:
            raise rd.fail(f"field '{where}.hosts[{i}]' must be [declared vertex, host name], got {json.dumps(h)[:60]}")
        hosts.append((h[0], h[1]))
    return Topology(
        name=name,
        nodes=tuple(v for v, k in names.items() if k == "nodes"),
        switches=tuple(v for v, k in names.items() if k == "switches"),
        links=tuple(links),
        hosts=tuple(hosts),
    )


def _decode(d: Any, rd: _Reader) -> Plan:
    if not isinstance(d, dict):
        raise rd.fail("not an hcc plan file (the top level is not a JSON object)")
    fmt = d.get("format")
    if fmt != FORMAT:
        raise rd.fail(f"not an hcc plan file (format {json.dumps(fmt)}, expected {FORMAT!r})")
    ver = d.get("version")
    if ver != PLAN_VERSION or type(ver) is not int:
        raise rd.fail(f"plan format version {json.dumps(ver)} is not supported (this hcc reads version {PLAN_VERSION})")
    g = rd.get
    ranks = g(d, "ranks", (list,))
    if not all(isinstance(x, str) for x in ranks):
        raise rd.fail("field 'ranks' must be a list of vertex names")
    if len(ranks) > MAX_VERTICES:
        raise rd.fail(f"field 'ranks' has {len(ranks)} ranks; a topology has at most {MAX_VERTICES} vertices")
    topology = topology_from_dict(g(d, "topology", (dict,)), rd.source)
    strangers = [r for r in ranks if r not in set(topology.nodes)]
    if strangers:
        raise rd.fail(f"field 'ranks' names {strangers[0]!r}, which is not a node of the plan's topology")
    size_bytes = g(d, "size_bytes", (int,))
    if not 0 <= size_bytes <= MAX_BYTES:
        raise rd.fail(f"field 'size_bytes' is {size_bytes}; a size is 0 .. 2^50 B")
    chunk_bytes = g(d, "chunk_bytes", (int,))
    if not 0 <= chunk_bytes <= MAX_BYTES:
        raise rd.fail(f"field 'chunk_bytes' is {chunk_bytes}; a chunk is 0 .. 2^50 B")
    tmp_elems = tuple(_ints(rd, g(d, "tmp_elems", (list,)), "tmp_elems"))
    if any(not 0 <= t <= MAX_BYTES for t in tmp_elems):
        raise rd.fail("field 'tmp_elems' holds a length outside 0 .. 2^50 elements")
    fig_d = g(d, "figures", (dict,), optional=True, default={})
    fig_kw = {}
    for f in dataclasses.fields(Figures):
        if f.name not in fig_d:  # figures added later keep their defaults in older files
            continue
        if f.type in ("str", str):
            fig_kw[f.name] = g(fig_d, f.name, (str,), where="figures.")
        elif str(f.type).startswith("tuple"):
            v = g(fig_d, f.name, (list,), where="figures.")
            if f.name == "cut_links":
                if not all(isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x) for x in v):
                    raise rd.fail("field 'figures.cut_links' must be a list of [src, dst] vertex names")
                fig_kw[f.name] = tuple((x[0], x[1]) for x in v)
            else:
                if not all(isinstance(x, str) for x in v):
                    raise rd.fail(f"field 'figures.{f.name}' must be a list of vertex names")
                fig_kw[f.name] = tuple(v)
        else:
            want = (int,) if f.type in ("int", int) else (float,)
            v = g(fig_d, f.name, want, where="figures.")
            fig_kw[f.name] = int(v) if want == (int,) else float(v)
    trees = []
    for i, t in enumerate(g(d, "trees", (list,))):
        w = f"trees[{i}]."
        if not isinstance(t, dict):
            raise rd.fail(f"field 'trees[{i}]' must be an object")
        span = _ints(rd, g(t, "span", (list,), w), w + "span")
        if len(span) != 2:
            raise rd.fail(f"field '{w}span' must be [lo, hi]")
        paths = g(t, "paths", (list,), w, optional=True, default=[])
        if not all(isinstance(p, list) and all(isinstance(x, str) for x in p) for p in paths):
            raise rd.fail(f"field '{w}paths' must be a list of vertex-name lists")
        rate = float(g(t, "rate", (float,), w))
        if not rate >= 0:
            raise rd.fail(f"field '{w}rate' is {rate}; a tree's rate is a finite number ≥ 0")
        trees.append(Tree(
            index=g(t, "index", (int,), w),
            root=g(t, "root", (int,), w),
            parent=tuple(_ints(rd, g(t, "parent", (list,), w), w + "parent")),
            rate=rate,
            span=(span[0], span[1]),
            paths=tuple(tuple(p) for p in paths),
        ))
    progs_d = g(d, "programs", (list,))
    programs = []
    for r, prog in enumerate(progs_d):
        if not isinstance(prog, list):
            raise rd.fail(f"field 'programs[{r}]' must be a list of ops")
        programs.append(tuple(_decode_op(rd, a, r, i) for i, a in enumerate(prog)))
    steps = []
    for k, progs in enumerate(g(d, "step_programs", (list,), optional=True, default=[])):
        if not isinstance(progs, list) or not all(isinstance(prog, list) for prog in progs):
            raise rd.fail(f"field 'step_programs[{k}]' must be a list of programs (lists of ops)")
        steps.append(tuple(tuple(_decode_op(rd, a, r, i, f"step_programs[{k}]") for i, a in enumerate(prog))
                           for r, prog in enumerate(progs)))
    return Plan(
        name=g(d, "name", (str,)),
        kind=g(d, "kind", (str,)),
        ranks=tuple(ranks),
        root=g(d, "root", (int,)),
        size_bytes=size_bytes,
        dtype=g(d, "dtype", (str,)),
        op=g(d, "op", (str, None)),
        algorithm=g(d, "algorithm", (str,)),
        chunk_bytes=chunk_bytes,
        trees=tuple(trees),
        programs=tuple(programs),
        tmp_elems=tmp_elems,
        topology=topology,
        figures=Figures(**fig_kw),
        compress=g(d, "compress", (str,), optional=True, default="none"),
        on_failure=g(d, "on_failure", (str,), optional=True, default="abort"),
        adaptive=g(d, "adaptive", (bool, None), optional=True, default=False),
        peers=g(d, "peers", (str, None), optional=True, default=None),
        step_programs=tuple(steps),
        version=ver,
    )


def loads(text: str, source: str = "<plan>") -> Plan:
    """Parse a plan file's text and verify the plan; every fault is a :class:`PlanError`
    prefixed with ``source``."""
    rd = _Reader(source)
    if not isinstance(text, str):
        raise rd.fail(f"a plan file's text must be a str, got {type(text).__name__}")
    try:
        d = json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except json.JSONDecodeError as e:
        hint = " (the file looks truncated)" if e.pos >= len(text.rstrip()) else ""
        raise rd.fail(f"not a valid plan file: {e.msg} at line {e.lineno} column {e.colno}{hint}") from None
    except _Refused as e:
        raise rd.fail(f"not a valid plan file: {e}") from None
    except RecursionError:
        raise rd.fail("not a valid plan file: nested too deeply") from None
    plan = _decode(d, rd)
    try:
        plan.verify()
    except VerifyError as e:
        raise VerifyError(e.message, source, e.rank, e.op) from None
    return plan


def load(path: str | os.PathLike) -> Plan:
    """Read and verify the plan file at ``path`` (see :func:`loads`)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ArgumentTypeError(f"Plan.load: expected a path (str or os.PathLike), got {type(path).__name__}")
    source = os.fsdecode(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PlanError(f"cannot read the plan file: {e.strerror or e}", source) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanError(f"not a valid plan file: not UTF-8 text (byte {e.start})", source) from None
    return loads(text, source)


# -- summary -----------------------------------------------------------------------------------
def summary(plan: Plan) -> dict:
    """The facts of a plan, as ``hcc compile --json`` prints them (one object per plan)."""
    f = plan.figures
    return {
        "name": plan.name,
        "kind": plan.kind,
        "topology": plan.topology.name,
        "ranks": plan.n,
        "root": plan.ranks[plan.root] if plan.root >= 0 else None,
        "size_bytes": plan.size_bytes,
        "dtype": plan.dtype,
        "op": plan.op,
        "algorithm": plan.algorithm,
        "trees": len(plan.trees),
        "chunk_bytes": plan.chunk_bytes,
        "compress": plan.compress,
        "rate_Bps": f.rate_Bps,
        "bound_rate_Bps": f.bound_rate_Bps,
        "predicted_s": f.predicted_s,
        "bound_s": f.bound_s,
        "message_bound_s": f.message_bound_s,
        "latency_bound_s": f.latency_bound_s or None,
        "efficiency_vs_latency_bound": f.latency_bound_s / f.predicted_s if f.latency_bound_s and f.predicted_s > 0 else None,
        "latency_bound": {"chunk_bytes": f.latency_chunk_bytes, "rate_s": f.latency_rate_s, "hops": f.latency_hops,
                          "hop_s": f.latency_hop_s, "cut_links": f.latency_fanout, "degree": f.latency_degree,
                          "ranks_beyond": f.latency_beyond} if f.latency_bound_s else None,
        "efficiency": f.efficiency,
        "ring_predicted_s": f.ring_predicted_s,
        "tree_predicted_s": f.tree_predicted_s,
        "speedup_over_ring": f.ring_predicted_s / f.predicted_s if f.predicted_s > 0 and f.ring_predicted_s > 0 else None,
        "algbw_Bps": f.algbw_Bps,
        "busbw_Bps": f.busbw_Bps,
        "wire_bytes": f.wire_bytes,
        "exact_predicted_s": f.exact_predicted_s or None,
        "speedup_over_exact": f.exact_predicted_s / f.predicted_s if f.exact_predicted_s and f.predicted_s > 0 else None,
        "compile_s": f.compile_s,
        "baseline": f.baseline or None,
        "baseline_predicted_s": f.baseline_predicted_s or None,
        "speedup_over_baseline": f.baseline_predicted_s / f.predicted_s if f.baseline_predicted_s and f.predicted_s > 0 else None,
        "rings_predicted_s": f.rings_predicted_s or None,
        "ring_channels": f.ring_channels,
        "rd_predicted_s": f.rd_predicted_s or None,
        "pack_rate_Bps": f.pack_rate_Bps or None,
        "cut": {"vertices": list(f.cut_vertices), "links": [list(l) for l in f.cut_links],
                "capacity_Bps": f.cut_capacity_Bps, "direction": f.cut_direction, "what": f.cut_note}
        if f.cut_direction else None,
        "breakdown": {"bandwidth_bound_s": f.bandwidth_bound_s, "load_s": f.load_s, "fill_s": f.fill_s,
                      "message_s": f.message_s, "contention_s": f.contention_s,
                      "bottleneck_link": list(f.bottleneck_link)} if f.bottleneck_link else None,
    }
