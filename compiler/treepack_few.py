"""hcc.compiler.treepack_few — few trees with CP-SAT.

Many trees mean many small chunks and more per-message cost. Given the LP's packing, CP-SAT
searches K tree slots per root, each an arborescence of binary rank-edge variables with
single-commodity flow connectivity and an integer weight in units of a rate quantum q (the
gcd of the capacities and, for allgather, of the exact cut-bound rate; then q/2, q/4), under
per-link capacity rows, minimising the trees used subject to every root's rate >= the
target. It builds its own trees: on DGX-1 the LP's columns need 20 trees where 4 suffice.
The search runs on a deterministic work budget with one worker and a fixed seed, so the same
program gets the same trees on an idle laptop and on a loaded CI machine.
"""
from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np

from . import progress
from .switches import Indexed
from .treepack_master import _Col, _Pricer

# CP-SAT few-trees search is tried up to this many ranks and tree slots (model size)
# (at 32 ranks, the 4x8 cluster, CP-SAT found no solution within 6 s even when restricted
# to the LP's edges)
_FEW_MAX_RANKS = 16
_FEW_MAX_SLOTS = 8
# joint allgather search (N roots x slots x edges booleans): DGX-1's 8 ranks is the size
# that still answers within its 0.3 s budget
_FEW_MAX_ALLGATHER_RANKS = 8
# CP-SAT budgets in *deterministic* seconds (OR-Tools' work measure, about a second of an
# idle core; at load average 10 on this 2-core machine one took 5.5 s of wall time).
# Allgather: the joint model on DGX-1's NVLinks finds 14 trees (LP: 31) within 0.1 (13 within
# 0.25); with the PCIe switches it finds none even in 3 (nor with a 1 GB/s quantum and the
# rate rounded down), so a larger budget only costs time: 0.1
_FEW_ALLGATHER_BUDGET_S = 0.1
# ... and the joint model is skipped above this many candidate rank edges: DGX-1's NVLinks
# give 32 (solved), with its PCIe switches 67 (never solved), the 5-rank samples fewer
_FEW_MAX_ALLGATHER_EDGES = 48
# Broadcast/reduce: DGX-1 proves 4 trees optimal in 0.016, with its PCIe switches (quantum
# 1 GB/s) 5 trees in 0.10-0.14; 0.5 keeps every sample's search finishing, so deterministic
_FEW_BROADCAST_BUDGET_S = 0.5


def _frac_gcd(a: Fraction, b: Fraction) -> Fraction:
    return Fraction(math.gcd(a.numerator * b.denominator, b.numerator * a.denominator),
                    a.denominator * b.denominator)


def _quanta(cap: np.ndarray, rate: Fraction | None = None) -> list[Fraction]:
    """Rate quanta to try, in bytes/s: the largest q dividing every whole-byte capacity (and
    the exact target ``rate`` when given), then q/2 and q/4. DGX-1 broadcast needs only
    q = 25 GB/s; its allgather rate 150/7 GB/s gives q = 25/7 GB/s."""
    if not (all(float(c).is_integer() for c in cap) and cap.max() < 2**62):
        return []
    g = Fraction(0)
    for c in cap:
        g = _frac_gcd(g, Fraction(int(c)))
    if rate is not None:
        g = _frac_gcd(g, rate)
    return [g / d for d in (1, 2, 4)]


def _few_trees(ix: Indexed, pricer: _Pricer, roots: list[int], cols, weights, target_rate: float,
               exact_rate: Fraction | None, deadline: float, scale: float, budget: float,
               max_depth: int | None = None):
    """CP-SAT: the fewest arborescences (of its own making) such that every root in ``roots``
    gets at least ``target_rate`` bytes/s (one root: broadcast; every rank: allgather).

    Each root has tree slots; slot k is a set of binary rank edges with in-degree 1 at every
    non-root rank and a single-commodity flow from the root (so it is a spanning arborescence
    when used), with an integer weight in quanta; link rows bound the summed weights.
    With ``max_depth`` every slot also carries a level per rank (an edge a -> b forces
    level(b) >= level(a) + 1, levels <= max_depth), so the trees found are no deeper than
    the depth-bounded phase's (treepack_shallow.py).
    Returns ``([(col, rate bytes/s), ...], method)`` or ``(None, reason)``.
    """
    from ortools.sat.python import cp_model

    n = pricer.n
    lp_count = {r: 0 for r in roots}
    for c, w in zip(cols, weights):
        if w > 1e-12:
            lp_count[c.root] += 1
    used_lp = sum(lp_count.values())
    if n > _FEW_MAX_RANKS or (len(roots) > 1 and n > _FEW_MAX_ALLGATHER_RANKS):
        return None, f"lp(cpsat skipped: {n} ranks)"
    # a broadcast's depth-capped search (treepack.pack_broadcast's ``depth``) wants trees no
    # deeper than the cap at the target, as few as it finds: as many as the LP's are kept too,
    # and the LP's may be one tree short of the target
    capped = max_depth is not None and len(roots) == 1
    if used_lp <= len(roots) and not capped:
        return None, "lp(already one tree per root)"
    quanta = _quanta(pricer.cap, exact_rate)
    if not quanta:
        return None, "lp(cpsat skipped: capacities not whole bytes/s)"
    # candidate rank edges: every routed edge of a column the LP generated (weighted or not).
    # Adding each pair's fewest-hop route as well doubled the search: DGX-1 broadcast proved
    # 5 trees optimal in 0.119 deterministic s with them, 0.055 without, and the 16-rank
    # two-host broadcast needed 0.67 with them, 0.19 without, for the same 8 trees
    cand: dict[tuple[int, int, tuple[int, ...]], None] = {}
    for c, w in zip(cols, weights):
        for v, p in enumerate(c.parent):
            if p != -1:
                cand[(p, v, c.paths[v])] = None
    if len(roots) > 1 and len(cand) > _FEW_MAX_ALLGATHER_EDGES:
        return None, f"lp(cpsat skipped: {len(cand)} candidate edges)"
    reason = "lp(cpsat found no fewer trees)"
    spent = 0.0  # deterministic seconds used by earlier quanta
    for q in quanta:
        remaining = deadline - time.perf_counter()
        if remaining <= 0.005:
            return None, "lp(cpsat stopped by the wall-clock safety net)"
        if budget - spent <= 1e-3:
            return None, "lp(cpsat out of budget)"
        units = [int(Fraction(int(c)) / q) for c in pricer.cap]
        if isinstance(target_rate, Fraction):
            target = math.ceil(target_rate / q)
        else:
            target = math.ceil(target_rate / float(q) - 1e-9)
        wmax = max(1, min(target, max(units)))
        m = cp_model.CpModel()
        slots = []  # (root, used, weight, edge list, edge bools)
        loads: dict[int, list] = {}
        for r in roots:
            edges = [e for e in cand if e[1] != r]
            k_r = min(max(2, lp_count[r]) if capped else lp_count[r] if len(roots) > 1 else lp_count[r] - 1,
                      _FEW_MAX_SLOTS)
            # hint: the root's heaviest LP trees, weights rounded to quanta (not feasible in
            # general, but it steers the first solution: on DGX-1 with PCIe switches and a
            # 1 GB/s quantum, CP-SAT found none within 1 s without it)
            heavy = sorted(((w, c) for c, w in zip(cols, weights) if c.root == r and w > 1e-12),
                           key=lambda p: -p[0])
            prev = None
            wsum = []
            for k in range(max(1, k_r)):
                used = m.NewBoolVar("")
                wt = m.NewIntVar(0, wmax, "")
                xs = [m.NewBoolVar("") for _ in edges]
                fl = [m.NewIntVar(0, n - 1, "") for _ in edges]
                m.Add(wt <= wmax * used)
                m.Add(wt >= used)
                into: list[list[int]] = [[] for _ in range(n)]
                outof: list[list[int]] = [[] for _ in range(n)]
                for i, (a, b, path) in enumerate(edges):
                    m.Add(fl[i] <= (n - 1) * xs[i])
                    m.AddImplication(xs[i], used)
                    into[b].append(i)
                    outof[a].append(i)
                    y = m.NewIntVar(0, wmax, "")
                    m.Add(y == wt).OnlyEnforceIf(xs[i])
                    m.Add(y == 0).OnlyEnforceIf(xs[i].Not())
                    for a2, b2 in zip(path, path[1:]):
                        loads.setdefault(pricer.link_of[(a2, b2)], []).append(y)
                for v in range(n):
                    if v == r:
                        m.Add(sum(fl[i] for i in outof[v]) - sum(fl[i] for i in into[v]) == (n - 1) * used)
                    else:
                        m.Add(sum(xs[i] for i in into[v]) == used)
                        m.Add(sum(fl[i] for i in into[v]) - sum(fl[i] for i in outof[v]) == used)
                if max_depth is not None:
                    lv = [m.NewIntVar(0, max_depth, "") for _ in range(n)]
                    m.Add(lv[r] == 0)
                    for i, (a, b, _) in enumerate(edges):
                        m.Add(lv[b] >= lv[a] + 1).OnlyEnforceIf(xs[i])
                if prev is not None:  # a root's slots are interchangeable: order them
                    m.Add(used <= prev[0])
                    m.Add(wt <= prev[1])
                prev = (used, wt)
                wsum.append(wt)
                slots.append((r, used, wt, edges, xs))
                if k < len(heavy):
                    w_lp, c_lp = heavy[k]
                    mine = {(c_lp.parent[v], v, c_lp.paths[v]) for v in range(n) if c_lp.parent[v] != -1}
                    m.AddHint(used, True)
                    m.AddHint(wt, max(1, min(wmax, round(w_lp * scale / float(q)))))
                    for i, e in enumerate(edges):
                        m.AddHint(xs[i], e in mine)
                else:
                    m.AddHint(used, False)
            m.Add(sum(wsum) >= target)
        for li, ys in loads.items():
            m.Add(sum(ys) <= units[li])
        m.Minimize(sum(s[1] for s in slots))
        solver = cp_model.CpSolver()
        # a *deterministic* work budget, one worker and a fixed seed: the same program gets
        # the same trees whatever the machine's load (golden tests compare tree counts). The
        # wall-clock limit is only a safety net (the whole pack's time_limit, 120 s by
        # default, against 0.5 s budgets that take 0.4-5.5 s of wall time even at load 10);
        # when it fires the method says so, since the result then depends on the machine
        progress.report("pack", f"few trees (CP-SAT, quantum {float(q):.6g} B/s)")
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = 1
        solver.parameters.max_deterministic_time = budget - spent
        solver.parameters.max_time_in_seconds = max(0.005, remaining)
        st = solver.Solve(m)
        spent += solver.deterministic_time
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if st == cp_model.UNKNOWN:
                if time.perf_counter() >= deadline - 0.005:
                    return None, "lp(cpsat stopped by the wall-clock safety net)"
                reason = "lp(cpsat out of budget)"
            continue
        count = sum(solver.Value(s[1]) for s in slots)
        if count > used_lp or (count == used_lp and not capped):
            return None, reason
        status = "optimal" if st == cp_model.OPTIMAL else "best within budget"
        out = []
        for r, used, wt, edges, xs in slots:
            if not solver.Value(used):
                continue
            par, paths, use = [-1] * n, [()] * n, {}
            for i, (a, b, path) in enumerate(edges):
                if solver.Value(xs[i]):
                    par[b], paths[b] = a, path
                    for a2, b2 in zip(path, path[1:]):
                        li = pricer.link_of[(a2, b2)]
                        use[li] = use.get(li, 0) + 1
            col = _Col(r, tuple(par), tuple(paths), tuple(sorted(use.items())))
            out.append((col, solver.Value(wt) * float(q)))
        return out, f"colgen+cpsat({status}, quantum {float(q):.6g} B/s)"
    return None, reason
