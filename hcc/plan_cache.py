"""hcc.plan_cache — the plans a communicator runs: compiled once per key, kept in memory and on
disk, and the topology they are compiled for.

Terms
- plan key: ``(kind, count, dtype, op, root)``. A plan is compiled the first time its key is
  used, then kept in memory and on disk (:class:`PlanCache`) under the digest of the
  topology, the rank mapping, the cost model and hcc's version.
- reference size: a call of ``b`` bytes (at least :data:`SPECIALISE_MIN_BYTES`) is planned
  from its octave's reference, the largest power of two ``R <= b``, and every octave's
  reference from one size-generic plan, the full compile at :data:`GENERIC_BYTES`: the
  compiler's search (every algorithm at every chunk size, with the baselines) runs once per
  (kind, dtype, op, root); an octave's reference is the generic plan's algorithm over the
  process's packing with its chunk size searched afresh over the whole chunk grid for R (a
  new octave costs one algorithm's lowering, not the search); a size of that octave is
  *specialised* from R: R's algorithm, lowered at R's chunk scaled to the size (the same
  number of chunks) and at R's chunk as is, the faster of the two by the cost model. A plan
  depends on its key only, never on which sizes a process saw before (the ranks of a job may
  have different caches on disk and must still run one plan). ``HCC_PLAN_SEARCH=full`` runs
  the whole search for every size.
- topology: the ``topology`` of an ``.hcl`` file (``HCC_TOPOLOGY=path.hcl``; ``HCC_RANKS=a,b,..``
  names the vertex of each rank, default the topology's nodes in declaration order), or the
  default :func:`star_topology`: every rank joined to one switch. Its links are those of the
  path the ranks take: 8 GB/s, with the shared-memory runner's measured per-message cost as
  latency, when every rank is on one host (hcc.collectives: the shared-memory channels), else
  10 Gbit/s, 20 us (ranks on one top-of-rack switch).

The communicator that runs these plans, and its slots, lanes and failure reports, is
hcc/collectives.py.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
from typing import Any

from .grammar.diagnostics import HccError
from .runner import SHM_PER_MESSAGE_S

__all__ = ["PlanCache", "CollectiveError", "star_topology", "resolve_topology",
           "SPECIALISE_MIN_BYTES", "GENERIC_BYTES"]

# Below this a size is compiled in full: few chunk sizes to try (a 64 KiB buffer has 5), so
# the search is already short, and small calls are where algorithms change fastest with size.
SPECIALISE_MIN_BYTES = 256 << 10
# The size-generic reference: every octave's reference is lowered with the algorithm the full
# search picks at this size (one compile per kind, dtype, op and root), its chunk size searched
# again. 1 MiB: a full compile there took 1.3 s where one at 64 MiB took 9.7 s (slow4, 4 ranks),
# and it is the bucket size range DDP starts from (its first bucket is 1 MiB).
GENERIC_BYTES = 1 << 20


class CollectiveError(HccError, RuntimeError):
    """A collective failed; the text names the ranks and their calls when known."""


# ---------------------------------------------------------------------------- topology


STAR_BPS = 1.25e9  # 10 Gbit/s: a common NIC, and a rate loopback TCP reaches between two cores
STAR_LATENCY_S = 20e-6
# Every rank on one host, over the shared-memory channels: 8 GB/s per rank, the single stream
# of a memory copy between two local ranks rounded down (MPICH's shared memory measured 10-12
# GB/s for 1-16 MiB; 4 ranks share the host's memory bandwidth), and as latency the native
# runner's measured cost per message (hcc/runner.py SHM_PER_MESSAGE_S);
# benchmarks/runtime_bench.py compiles its shared-memory plans on the same star.
SHM_STAR_BPS = 8e9
SHM_STAR_LATENCY_S = SHM_PER_MESSAGE_S


def star_topology(world: int, shm: bool = False) -> str:
    """HCL source of the default topology: ``rank0 .. rank{world-1}`` around one switch
    (``shm``: the links of ranks that share one host's memory)."""
    link = f"8 GB/s, {SHM_STAR_LATENCY_S * 1e6:g} us" if shm else "10 Gbit/s, 20 us"
    return (f"topology hcc_star {{\n    node rank[0..{world - 1}]\n    switch hub\n"
            f"    rank[0..{world - 1}] <-> hub : {link}\n}}\n")


def _star_program(world: int, shm: bool = False):
    """The Program of :func:`star_topology` without the parser (tests check they agree)."""
    from .compiler.program import Program
    from .ir.topology import Link, Topology

    nodes = tuple(f"rank{i}" for i in range(world))
    bps, lat = (SHM_STAR_BPS, SHM_STAR_LATENCY_S) if shm else (STAR_BPS, STAR_LATENCY_S)
    links = []
    for v in nodes:
        links += [Link(v, "hub", bps, lat), Link("hub", v, bps, lat)]
    topo = Topology(name="hcc_star", nodes=nodes, switches=("hub",), links=tuple(links))
    return Program(path="<default star>", topologies={topo.name: topo}, collectives=())


def resolve_topology(world: int, topology: str | os.PathLike | None = None,
                     ranks: str | list[str] | None = None, shm: bool = False):
    """``(Program, topology name, rank vertex names)`` for a job of ``world`` ranks.

    ``topology``: a path to an ``.hcl`` file or HCL source; None reads ``HCC_TOPOLOGY`` and
    falls back to :func:`star_topology` (``shm``: every rank on this host). ``ranks``: the
    vertex of each rank (a list, or a comma-separated string; None reads ``HCC_RANKS``),
    default the topology's nodes in order."""
    from .api import load

    if topology is None:
        topology = os.environ.get("HCC_TOPOLOGY") or None
    if ranks is None:
        ranks = os.environ.get("HCC_RANKS") or None
    # the default star is built directly: it is what its source parses to, and building the
    # parser costs a rank 0.6 s at start-up
    program = _star_program(world, shm) if topology is None else load(topology)
    if not program.topologies:
        raise CollectiveError(f"{program.path}: declares no topology")
    want = os.environ.get("HCC_TOPOLOGY_NAME")
    if want and want not in program.topologies:
        raise CollectiveError(f"{program.path}: no topology {want!r} "
                              f"(topologies: {', '.join(program.topologies)})")
    name = want or next(iter(program.topologies))
    topo = program.topologies[name]
    if ranks is None:
        names = list(topo.nodes[:world])
        if len(names) < world:
            raise CollectiveError(f"{program.path}: topology {name!r} has {len(topo.nodes)} nodes, "
                                  f"the job {world} ranks (name them with HCC_RANKS)")
    else:
        names = [r.strip() for r in ranks.split(",")] if isinstance(ranks, str) else list(ranks)
        unknown = [r for r in names if r not in topo.nodes]
        if len(names) != world or unknown or len(set(names)) != world:
            raise CollectiveError(
                f"HCC_RANKS must name {world} distinct nodes of topology {name!r}; got {names}"
                + (f" (not nodes: {', '.join(unknown)})" if unknown else ""))
    return program, name, tuple(names)


# ---------------------------------------------------------------------------- plans


def _version() -> str:
    from . import __version__

    return __version__


class PlanCache:
    """Plans per key, compiled on first use, kept in memory and under ``directory``.

    ``directory`` (default ``$HCC_CACHE_DIR`` or ``~/.cache/hcc/plans``) gets one folder per
    topology digest; a plan file is written atomically (ir/files.py), and the ranks of one
    host that miss the same key at once compile it once: the first takes an ``flock`` on
    ``<file>.lock``, the others wait on it and read its file."""

    def __init__(self, program, topo_name: str, ranks: tuple[str, ...], directory: str | None = None,
                 model=None):
        from .runner import RUN_MODELS

        self.program, self.topo_name, self.ranks = program, topo_name, ranks
        self.model = model or RUN_MODELS["sockets"]
        topo = program.topologies[topo_name]
        self.search = "full" if os.environ.get("HCC_PLAN_SEARCH", "").lower() == "full" else "generic"
        ident = json.dumps({"topology": topo.to_dict(), "ranks": list(ranks), "hcc": _version(),
                            "model": repr(self.model), "search": self.search}, sort_keys=True)
        self.digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
        base = directory or os.environ.get("HCC_CACHE_DIR") or os.path.join(
            os.path.expanduser("~"), ".cache", "hcc", "plans")
        self.directory = os.path.join(base, self.digest)
        self._plans: dict[tuple, Any] = {}
        self._packings: dict[tuple, Any] = {}  # (kind, root) -> the pack pass's packings
        self._lock = threading.Lock()
        self.compiled = 0  # plans compiled by this process (the rest came from disk or memory)
        self.specialised = 0  # of which specialised from their octave's reference
        self.compile_s = 0.0
        self.loaded = 0

    def get(self, kind: str, count: int, dtype: str, op: str | None, root: int):
        key = (kind, count, dtype, op, root)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        with self._lock:  # one compile at a time per process: they are CPU-bound
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = self._load_or_compile(key)
        return plan

    def _file(self, key: tuple) -> str:
        kind, count, dtype, op, root = key
        return os.path.join(self.directory, f"{kind}-{count}-{dtype}-{op or 'none'}-{root}.json")

    def _load_or_compile(self, key: tuple):
        from .ir.plan import Plan

        path = self._file(key)
        try:
            os.makedirs(self.directory, exist_ok=True)
            lock = open(path + ".lock", "a")
        except OSError:
            return self._compile(key)  # no writable cache: compile in memory only
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(path):
                try:
                    plan = Plan.load(path)
                    self.loaded += 1
                    return plan
                except HccError:
                    pass  # a file of another format: compile and replace it
            plan = self._compile(key)
            try:
                plan.save(path)
            except OSError:
                pass
            return plan

    def reference(self, key: tuple) -> tuple | None:
        """The key of the plan ``key`` is specialised from (module docstring), or None when
        ``key`` is compiled in full: a size is specialised from its octave's reference, an
        octave's reference from the size-generic plan of :data:`GENERIC_BYTES`."""
        from .ir.plan import DTYPE_SIZES

        kind, count, dtype, op, root = key
        item = DTYPE_SIZES[dtype]
        size = count * item
        if self.search == "full" or kind == "alltoall" or size < SPECIALISE_MIN_BYTES:
            return None
        ref = 1 << (size.bit_length() - 1)
        if ref % item or GENERIC_BYTES % item:
            return None
        if ref == size:  # an octave's reference: from the generic plan, unless it is that one
            return None if size == GENERIC_BYTES else (kind, GENERIC_BYTES // item, dtype, op, root)
        return (kind, ref // item, dtype, op, root)

    def _compile(self, key: tuple):
        """The compiler's passes for one key, with the packing shared across sizes: the
        ``pack`` pass is a function of the topology, the ranks, the kind and the root only
        (never of the size, dtype or op), so a process packs each (kind, root) once and a new
        size pays only for lowering it. Measured on BENCHMARKS.md's slow4 (4 ranks, 4 MB
        allreduce): pack 0.9 s of a 2.2 s compile. A key with a :meth:`reference` is lowered
        with its reference plan's algorithm only, at two chunk sizes (:meth:`_specialise`)."""
        from dataclasses import replace

        from .compiler.pipeline import PASSES, Unit
        from .compiler.program import CollectiveSpec
        from .ir.plan import DTYPE_SIZES, REDUCING_KINDS

        kind, count, dtype, op, root = key
        rkey = self.reference(key)
        ref = None
        if rkey is not None:  # under self._lock already (get): the reference's own load or compile
            ref = self._plans.get(rkey)
            if ref is None:
                ref = self._plans[rkey] = self._load_or_compile(rkey)
        spec = CollectiveSpec(name="c", kind=kind, topology=self.topo_name, ranks=self.ranks,
                              root=root, size_bytes=count * DTYPE_SIZES[dtype], dtype=dtype,
                              op=(op or "sum") if kind in REDUCING_KINDS else None, adaptive=False)
        t0 = time.perf_counter()
        if ref is not None:
            spec = replace(spec, algorithm=ref.algorithm)
        program = replace(self.program, collectives=(spec,))
        unit = Unit(program=program, spec=spec, topology=program.topology_of(spec), model=self.model)
        for p in PASSES:
            if p.name == "pack":
                packings = self._packings.get((kind, root))
                if packings is None:
                    # the full set (algorithm auto): a specialised key shares it with its reference
                    unit = p.apply(replace(unit, spec=replace(spec, algorithm="auto")))
                    unit = replace(unit, spec=spec)
                    self._packings[kind, root] = unit.packings
                else:
                    unit = replace(unit, packings=packings)
            elif p.name == "lower" and ref is not None:
                octave = count * DTYPE_SIZES[dtype]
                unit = self._reprice(unit, ref) if octave & (octave - 1) == 0 else self._specialise(unit, ref)
            else:
                unit = p.apply(unit)
        if ref is not None:
            self.specialised += 1
        elapsed = time.perf_counter() - t0
        plan = replace(unit.plan, figures=replace(unit.plan.figures, compile_s=elapsed))
        self.compile_s += elapsed
        self.compiled += 1
        return plan

    @staticmethod
    def _reprice(unit, generic):
        """The lower pass for an octave's reference: the size-generic plan's algorithm alone
        (its packing is the process's, shared by every size), its chunk size searched afresh
        over the compiler's whole chunk grid for this size; no baselines."""
        from dataclasses import replace

        from .compiler import registry
        from .compiler.chunks import choose_chunk, chunk_candidates
        from .compiler.pipeline import Candidate, CompileError

        spec = unit.spec
        build = registry.builder(generic.algorithm, unit)
        if build is None:
            raise CompileError(f"{spec.name}: {generic.algorithm} has no lowering for a {spec.kind} "
                               f"of {spec.size_bytes} bytes")
        cands = chunk_candidates(spec.size_bytes, max(1, generic.itemsize))
        most = registry.algorithm(generic.algorithm).max_chunks
        if most:
            cands = tuple(c for c in cands if c * most >= spec.size_bytes) or cands[:1]
        # tree plans are not unimodal in the chunk size while a share holds 1-3 chunks: a
        # second chance past the first slower size, as the full search gives them
        patience = 2 if registry.algorithm(generic.algorithm).treepack else 1
        choice = choose_chunk(build, cands, model=unit.model, patience=patience)
        return replace(unit, candidates=(Candidate(generic.algorithm, choice),))

    @staticmethod
    def _specialise(unit, ref):
        """The lower pass for a key with a reference plan ``ref``: ``ref``'s algorithm alone,
        priced at ``ref``'s chunk scaled to this size (as many chunks) and at ``ref``'s chunk
        as is (both multiples of the item size, at most the size); no baselines."""
        from dataclasses import replace

        from .compiler import registry
        from .compiler.chunks import choose_chunk
        from .compiler.pipeline import Candidate, CompileError

        spec = unit.spec
        size, item = spec.size_bytes, max(1, ref.itemsize)
        ref_size = ref.elems * ref.itemsize
        scaled = ref.chunk_bytes * size // ref_size if ref.chunk_bytes < ref_size else size
        cands = sorted({max(item, min(size, c - c % item)) for c in (scaled, ref.chunk_bytes)}, reverse=True)
        build = registry.builder(ref.algorithm, unit)
        if build is None:
            raise CompileError(f"{spec.name}: {ref.algorithm} has no lowering for a {spec.kind} of {size} bytes")
        choice = choose_chunk(build, tuple(cands), model=unit.model)
        return replace(unit, candidates=(Candidate(ref.algorithm, choice),))
