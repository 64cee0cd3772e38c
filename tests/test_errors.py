"""Every fault of language.md "Errors" (and the front end's brief) gets a SourceError at the
exact line and column of the faulty token, with the caret rendered under that column.

Expected positions are found in the test source itself (``at(src, needle)``: the line and
column where ``needle`` occurs), never read back from the implementation."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcc.compiler.frontend import load_program
from hcc.grammar.diagnostics import SourceError


def at(src: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """1-based (line, column) of the ``nth`` occurrence of ``needle`` in ``src``."""
    i = -1
    for _ in range(nth + 1):
        i = src.index(needle, i + 1)
    line = src.count("\n", 0, i) + 1
    col = i - (src.rfind("\n", 0, i) + 1) + 1
    return line, col


def check_error(src: str, line: int, col: int, fragment: str) -> SourceError:
    """Loading ``src`` fails at (line, col) with ``fragment`` in the message, and render()
    shows ``<string>:line:col: error:``, the source line and a caret under column ``col``."""
    with pytest.raises(SourceError) as info:
        load_program(src)
    e = info.value
    assert (e.span.line, e.span.col) == (line, col), e.render()
    assert fragment in e.message, e.render()
    out = e.render().splitlines()
    assert out[0] == f"<string>:{line}:{col}: error: {e.message}"
    assert out[1] == "    " + src.splitlines()[line - 1]
    assert out[2].index("^") == 4 + col - 1, e.render()
    return e


def check_at(src: str, needle: str, fragment: str, nth: int = 0, skip: int = 0) -> SourceError:
    """check_error at ``needle`` (its ``nth`` occurrence), ``skip`` columns further right."""
    line, col = at(src, needle, nth)
    return check_error(src, line, col + skip, fragment)


TOPO = """\
topology t {
    node gpu[0..3]
    switch sw
    class fast = 10 GB/s, 1 us
    gpu[0..3] <-> sw : fast
}
"""


def coll(body: str, kind: str = "allreduce", topo: str = "t", name: str = "c") -> str:
    return TOPO + f"collective {name} = {kind} on {topo} {{\n{body}\n}}\n"


# ---- the helper itself -------------------------------------------------------------------

def test_at_counts_from_one():
    assert at("ab\ncd", "d") == (2, 2)
    assert at("ab\ncd", "a") == (1, 1)


def test_check_error_rejects_a_wrong_column():
    src = TOPO.replace("gpu[0..3] <-> sw", "gpu[0..3] <-> sx")
    with pytest.raises(AssertionError):
        check_error(src, at(src, "sx")[0], at(src, "sx")[1] + 1, "unknown vertex")


# ---- syntax ------------------------------------------------------------------------------

def test_syntax_missing_colon():
    src = "topology t {\n    node a, b\n    a <-> b 10 GB/s\n}\n"
    e = check_at(src, "10 GB/s", "unexpected number '10 GB/s'; expected '.', ':' or '['")
    assert "QUANTITY" not in e.message


def test_syntax_unexpected_character():
    src = "topology t {\n    node a, b\n    a <- b : 1 GB/s\n}\n"
    e = check_at(src, "<-", "unexpected character '<'")
    assert "'<->'" in e.message and "'->'" in e.message


def test_syntax_unexpected_end_of_file():
    src = "topology t {\n    node a, b\n    a <-> b : 1 GB/s\n"
    e = check_error(src, 3, len("    a <-> b : 1 GB/s") + 1, "unexpected end of file")
    assert "'}'" in e.message


def test_syntax_expected_in_words_not_terminal_names():
    src = "topology t {\n    node 3a\n}\n"
    e = check_at(src, "3a", "expected a name")
    assert "NAME" not in e.message


def test_syntax_bad_collective_header():
    src = TOPO + "collective c = allreduce t { size = 1 MB }\n"
    check_at(src, "t {", "expected 'on'", nth=1)


# ---- names -------------------------------------------------------------------------------

def test_unknown_vertex_in_link_with_did_you_mean():
    src = TOPO.replace("    gpu[0..3] <-> sw : fast", "    gpu0 <-> gpo1 : fast")
    e = check_at(src, "gpo1", "unknown vertex 'gpo1'")
    assert "did you mean gpu1?" in e.message


def test_unknown_vertex_from_a_range():
    src = TOPO.replace("gpu[0..3] <-> sw", "gpu[0..4] <-> sw")
    e = check_at(src, "0..4", "unknown vertex 'gpu4'")  # the caret is on the range item
    assert "gpu[0..4]" in e.message


def test_unknown_vertex_in_ranks():
    src = coll("    ranks = gpu0, gpu1, gpu7\n    size = 1 MB")
    check_at(src, "gpu7", "unknown vertex 'gpu7'")


def test_unknown_vertex_as_root():
    src = coll("    root = gpx0\n    size = 1 MB", kind="broadcast")
    check_at(src, "gpx0", "did you mean gpu0?")


def test_unknown_qualified_vertex():
    src = """topology c {
    host h[0..1] {
        node gpu[0..1]
        switch nvs
        gpu[0..1] <-> nvs : 10 GB/s
    }
    switch tor
    h[0..2].nvs <-> tor : 1 GB/s
}
"""
    check_at(src, "0..2", "unknown vertex 'h2.nvs' (from h[0..2].nvs)")


def test_duplicate_vertex():
    src = TOPO.replace("switch sw", "switch sw, gpu2")
    e = check_at(src, "gpu2", "duplicate vertex name 'gpu2'")
    assert "line 2, column 10" in e.message


def test_duplicate_vertex_in_a_range():
    src = TOPO.replace("node gpu[0..3]", "node gpu[0..3], gpu[3..5]")
    check_at(src, "3..5", "duplicate vertex name 'gpu3'")


def test_duplicate_class():
    src = TOPO.replace("    gpu[0..3] <-> sw", "    class fast = 5 GB/s\n    gpu[0..3] <-> sw")
    check_at(src, "fast", "duplicate link class name 'fast'", nth=1)


def test_duplicate_topology():
    src = TOPO + "topology t {\n    node a\n}\n"
    check_error(src, 7, 10, "duplicate topology name 't'")


def test_duplicate_collective():
    src = coll("    size = 1 MB") + "collective c = broadcast on t {\n    size = 1 MB\n}\n"
    check_error(src, at(src, "collective c", 1)[0], len("collective ") + 1, "duplicate collective name 'c'")


def test_duplicate_key():
    src = coll("    size = 1 MB\n    dtype = float32\n    size = 2 MB")
    check_at(src, "size", "duplicate key 'size'", nth=1)


def test_duplicate_host():
    src = "topology c {\n    host h[0..1] { node g }\n    host h1 { node g }\n}\n"
    check_at(src, "h1", "duplicate host name 'h1'")


def test_unknown_topology_name():
    src = coll("    size = 1 MB", topo="tt")
    e = check_at(src, "tt", "unknown topology 'tt'")
    assert "topologies: t" in e.hint


def test_unknown_topology_did_you_mean():
    src = TOPO.replace("topology t", "topology dgx1") + "collective c = broadcast on dgx {\n size = 1 MB\n}\n"
    check_at(src, "dgx {", "did you mean dgx1?")


def test_unknown_collective_kind():
    src = coll("    size = 1 MB", kind="allreduc")
    check_at(src, "allreduc", "did you mean allreduce?")


def test_unknown_link_class():
    src = TOPO.replace("gpu[0..3] <-> sw : fast", "gpu[0..3] <-> sw : fst")
    check_at(src, "fst", "unknown link class 'fst' (did you mean fast?)")


def test_unknown_key():
    src = coll("    sise = 1 MB")
    check_at(src, "sise", "unknown key 'sise' (did you mean size?)")


@pytest.mark.parametrize(
    "key, bad, good",
    [
        ("dtype", "float23", "float32"),
        ("op", "summ", "sum"),
        ("algorithm", "treepak", "treepack"),
        ("compress", "int9", "int8"),
        ("on_failure", "abrt", "abort"),
        ("adaptive", "of", "off"),
    ],
)
def test_unknown_enumerated_value(key, bad, good):
    src = coll(f"    size = 1 MB\n    {key} = {bad}")
    check_at(src, bad, f"did you mean {good}?")


def test_unknown_peers_value():
    src = coll("    size = 1 MB\n    peers = rng", kind="neighbor_average")
    check_at(src, "rng", "did you mean ring?")


def test_enumerated_value_that_is_a_number():
    src = coll("    size = 1 MB\n    dtype = 4")
    check_at(src, "4\n", "expected a dtype")


# ---- links -------------------------------------------------------------------------------

def test_link_to_itself():
    src = TOPO.replace("gpu[0..3] <-> sw : fast", "gpu1 -> gpu1 : fast")
    check_at(src, "gpu1 :", "to itself")


def test_zero_bandwidth_literal():
    src = TOPO.replace("gpu[0..3] <-> sw : fast", "gpu[0..3] <-> sw : 0 GB/s")
    check_at(src, ": 0 GB/s", "a link bandwidth must be positive, got 0 GB/s", skip=2)


def test_negative_bandwidth_in_class():
    src = TOPO.replace("class fast = 10 GB/s", "class fast = -10 GB/s")
    check_at(src, "-10", "must be positive")


def test_negative_latency():
    src = TOPO.replace("gpu[0..3] <-> sw : fast", "gpu[0..3] <-> sw : fast, -1 us")
    check_at(src, "-1 us", "latency cannot be negative")


def test_negative_latency_in_class():
    src = TOPO.replace("10 GB/s, 1 us", "10 GB/s, -3 ns")
    check_at(src, "-3", "latency cannot be negative")


def test_zero_multiplicity():
    src = TOPO.replace(": fast\n", ": fast x0\n")
    check_at(src, "x0", "at least 1")


# ---- units -------------------------------------------------------------------------------

def test_wrong_unit_family_for_bandwidth():
    src = TOPO.replace("class fast = 10 GB/s", "class fast = 10 GB")
    e = check_at(src, "GB,", "expected a bandwidth like 25 GB/s")
    assert "'GB' is a size unit" in e.message


def test_wrong_unit_family_for_size():
    src = coll("    size = 25 GB/s")
    check_at(src, "GB/s", "expected a size like 256 MB", nth=1)


def test_wrong_unit_family_for_latency():
    src = TOPO.replace("10 GB/s, 1 us", "10 GB/s, 1 MB")
    check_at(src, "MB", "expected a time like 5 us")


def test_missing_unit_names_the_family():
    src = coll("    size = 100")
    check_at(src, "100", "a size needs a unit")


def test_missing_bandwidth_unit():
    src = TOPO.replace("gpu[0..3] <-> sw : fast", "gpu[0..3] <-> sw : 25")
    check_at(src, "25", "a bandwidth needs a unit")


def test_missing_latency_unit():
    src = TOPO.replace("10 GB/s, 1 us", "10 GB/s, 1")
    check_at(src, "1\n", "a time needs a unit")


def test_unknown_unit_suggests_bits():
    src = TOPO.replace("class fast = 10 GB/s", "class fast = 10 Gb/s")
    check_at(src, "Gb/s", "unknown unit 'Gb/s'; expected a bandwidth like 25 GB/s (did you mean Gbit/s?)")


def test_unknown_unit_case():
    src = coll("    size = 4 mb")
    check_at(src, "mb", "did you mean MB?")


# ---- ranks and root ----------------------------------------------------------------------

def test_root_outside_ranks():
    src = coll("    ranks = gpu[0..2]\n    root = gpu3\n    size = 1 MB", kind="broadcast")
    check_at(src, "gpu3", "root 'gpu3' is not one of the ranks")


def test_switch_as_rank():
    src = coll("    ranks = gpu0, sw, gpu1\n    size = 1 MB")
    check_at(src, "sw,", "'sw' is a switch and cannot be a rank")


def test_switch_as_root():
    src = coll("    root = sw\n    size = 1 MB", kind="reduce")
    check_at(src, "= sw", "cannot be the root", skip=2)


def test_rank_listed_twice():
    src = coll("    ranks = gpu[0..2], gpu1\n    size = 1 MB")
    e = check_at(src, "gpu1\n", "rank 'gpu1' is listed twice")
    line, col = at(src, "0..2")
    assert f"(first at line {line}, column {col})" in e.message


def test_root_on_an_unrooted_kind():
    src = coll("    root = gpu0\n    size = 1 MB", kind="allgather")
    check_at(src, "root", "'root' applies only to rooted kinds")


def test_root_is_a_range():
    src = coll("    root = gpu[0..1]\n    size = 1 MB", kind="broadcast")
    check_at(src, "gpu[0..1]", "the root is one vertex")


def test_fewer_than_two_ranks_explicit():
    src = coll("    ranks = gpu2\n    size = 1 MB", kind="broadcast")
    check_at(src, "gpu2", "a broadcast needs at least 2 ranks; got 1 (gpu2)")


def test_fewer_than_two_ranks_by_default():
    src = "topology one {\n    node a\n    switch s\n    a <-> s : 1 GB/s\n}\n" \
          "collective g = allgather on one {\n    size = 1 MB\n}\n"
    e = check_at(src, "g =", "an allgather needs at least 2 ranks")
    assert "topology one has 1 node" in e.message


def test_bad_range():
    src = TOPO.replace("node gpu[0..3]", "node gpu[3..0]")
    check_at(src, "3..0", "bad range 3..0")


def test_bad_range_in_ranks():
    src = coll("    ranks = gpu[0, 2..1]\n    size = 1 MB")
    check_at(src, "2..1", "bad range 2..1")


def test_qualified_name_declared_outside_its_host():
    src = "topology c {\n    node h0.gpu0\n}\n"
    check_at(src, "h0.gpu0", "declare it inside its host block")


# ---- kind-specific keys ------------------------------------------------------------------

def test_op_on_non_reducing_kind():
    src = coll("    size = 1 MB\n    op = max", kind="allgather")
    check_at(src, "op =", "'op' applies only to reducing kinds")


def test_op_on_neighbor_average():
    src = coll("    size = 1 MB\n    op = sum", kind="neighbor_average")
    check_at(src, "op =", "always takes the mean")


def test_peers_on_other_kind():
    src = coll("    size = 1 MB\n    peers = ring")
    check_at(src, "peers", "'peers' applies only to neighbor_average")


def test_op_avg_on_integers():
    src = coll("    size = 1 MB\n    dtype = int32\n    op = avg")
    check_at(src, "avg", "op = avg needs a floating-point dtype; dtype is int32")


@pytest.mark.parametrize("codec", ["int8", "fp16"])
def test_compress_on_integers(codec):
    src = coll(f"    size = 1 MB\n    dtype = int64\n    compress = {codec}")
    check_at(src, codec, f"compress = {codec} is a lossy float encoding")


def test_neighbor_average_on_integers():
    src = coll("    size = 1 MB\n    dtype = uint8", kind="neighbor_average")
    check_at(src, "uint8", "neighbor_average takes a mean and needs a floating-point dtype")


def test_shift_one_with_odd_rank_count():
    src = coll("    ranks = gpu[0..2]\n    size = 1 MB\n    peers = shift_one", kind="neighbor_average")
    check_at(src, "shift_one", "needs an even rank count; got 3")


# ---- sizes -------------------------------------------------------------------------------

def test_size_not_a_multiple_of_dtype():
    src = coll("    size = 10 B\n    dtype = float64")
    check_at(src, "10 B", "not a multiple of the float64 element size (8 B)")


def test_size_zero():
    src = coll("    size = 0 MB")
    check_at(src, "0 MB", "size must be positive")


def test_size_negative():
    src = coll("    size = -4 KB")
    check_at(src, "-4", "size must be positive")


def test_size_not_whole_bytes():
    src = coll("    size = 1.5 B\n    dtype = uint8")
    check_at(src, "1.5 B", "not a whole number of bytes")


def test_size_missing():
    src = coll("    dtype = float32", name="nosize")
    check_at(src, "nosize", "collective nosize has no size")


def test_alltoall_size_not_a_multiple_of_ranks_times_dtype():
    # 4 ranks x 4 B = 16 B; 1000 B = 62.5 blocks of 16
    src = coll("    size = 1000 B", kind="alltoall")
    check_at(src, "1000 B", "multiple of ranks × float32 size = 4 × 4 B = 16 B")


def test_chunk_not_a_multiple_of_dtype():
    src = coll("    size = 1 MB\n    chunk = 6 B")
    check_at(src, "6 B", "chunk 6 B (6 B) is not a multiple")


def test_chunk_must_be_a_size_or_auto():
    src = coll("    size = 1 MB\n    chunk = big")
    check_at(src, "big", "(or auto)")


# ---- connectivity ------------------------------------------------------------------------

DISCONNECTED = """\
topology d {
    node g[0..5]
    class nv = 25 GB/s
    g0 <-> g1 : nv
    g1 <-> g2 : nv
    g2 <-> g3 : nv
    g4 <-> g5 : nv
    g3 -> g4 : nv
}
"""


def test_unreachable_from_root_names_vertex_and_cut():
    src = DISCONNECTED + "collective b = broadcast on d {\n    ranks = g[0,1,3,4]\n    size = 1 MB\n}\n"
    # g3 is reached only through g2, which is not a rank
    e = check_at(src, ",3,", "rank 'g3' cannot be reached from the root 'g0'", skip=1)
    assert "{g0, g1}" in e.message and "capacity 0" in e.message
    assert "g2" in e.hint and "not a rank" in e.hint


def test_unreachable_default_ranks_points_at_the_name():
    src = DISCONNECTED.replace("    g2 <-> g3 : nv\n", "") + \
        "collective b = broadcast on d {\n    size = 1 MB\n}\n"
    e = check_at(src, "b =", "rank 'g3' cannot be reached from the root 'g0'")
    assert "{g0, g1, g2}" in e.message


def test_reduce_needs_every_rank_to_reach_the_root():
    # g3 -> g4 only: g4 and g5 cannot send to g0
    src = DISCONNECTED + "collective r = reduce on d {\n    size = 1 MB\n}\n"
    e = check_at(src, "r =", "rank 'g4' cannot reach the root 'g0'")
    assert "{g0, g1, g2, g3}" in e.message


def test_broadcast_over_a_one_way_link_is_fine():
    src = DISCONNECTED + "collective b = broadcast on d {\n    size = 1 MB\n}\n"
    assert load_program(src).collectives[0].ranks == tuple(f"g{i}" for i in range(6))


def test_unrooted_kind_needs_strong_connectivity():
    src = DISCONNECTED + "collective a = allreduce on d {\n    ranks = g[2..5]\n    size = 1 MB\n}\n"
    e = check_at(src, "2..5", "an allreduce needs its ranks strongly connected: 'g4' cannot reach 'g2'")
    assert "{g2, g3}" in e.message


def test_switches_forward_for_a_collective():
    src = TOPO + "collective a = allreduce on t {\n    ranks = gpu0, gpu3\n    size = 1 MB\n}\n"
    assert load_program(src).collectives[0].ranks == ("gpu0", "gpu3")


# ---- files -------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(SourceError) as info:
        load_program(tmp_path / "nope.hcl")
    assert "cannot read" in info.value.message
    for missing in ("no/such/plan.hcl", "plan.hcl", str(tmp_path)):  # a directory too
        with pytest.raises(SourceError) as info:
            load_program(missing)
        assert info.value.message.startswith(f"cannot read {missing}: ")
        assert info.value.render() == f"{missing}: error: {info.value.message}"


def test_errors_carry_the_file_path(tmp_path):
    p = tmp_path / "bad.hcl"
    p.write_text(coll("    size = 3 B"))
    with pytest.raises(SourceError) as info:
        load_program(str(p))
    line, col = at(p.read_text(), "3 B")
    assert info.value.render().startswith(f"{p}:{line}:{col}: error: ")


def test_syntax_missing_closing_brace_hints_at_it():
    src = "topology t {\n  node a, b\n  a <-> b : 1 GB/s\n\ncollective c = allreduce on t {\n  size = 1 MB\n}\n"
    e = check_at(src, "c =", "unexpected name 'c'")
    assert e.hint == "is a '}' missing before 'collective' on line 5?"


# ---- never a traceback: any edit of a valid program loads or fails with a SourceError --------

DEMO = (Path(__file__).resolve().parent.parent / "samples" / "dgx1_fragmented.hcl").read_text()
PIECES = list("{}[]=,.:#-<>x09 \n/") + ["..", "<->", "->", "node ", "host ", "collective ", " on ", "GB/s", "us"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(DEMO)), st.integers(0, 6), st.sampled_from(PIECES)),
                min_size=1, max_size=3))
def test_edited_programs_load_or_fail_cleanly(edits):
    src = DEMO
    for at_, cut, piece in edits:
        at_ = min(at_, len(src))
        src = src[:at_] + piece + src[at_ + cut:]
    try:
        load_program(src)
    except SourceError as e:
        lines = src.splitlines()
        assert 1 <= e.span.line <= max(1, len(lines))
        assert 1 <= e.span.col <= len(lines[e.span.line - 1] if lines else "") + 1
        assert e.render().startswith(f"<string>:{e.span.line}:{e.span.col}: error: ")


def test_syntax_missing_comma_in_a_list_hints_at_it():
    src = coll("    ranks = gpu0 gpu1\n    size = 1 MB")
    e = check_at(src, "size", "unexpected name 'size'; expected '='")
    assert e.hint == "is a ',' missing before 'gpu1', or an '=' after it?"


# ---- the Python API's own arguments (issue 21) -------------------------------------------------

API_SRC = "topology t { node a, b, c  a <-> b : 1 GB/s  b <-> c : 1 GB/s }\n" \
          "collective r = allreduce on t { size = 4 KB }\n"


@pytest.mark.parametrize("call, kind, fragment", [
    (lambda hcc, p: hcc.compile(p, 123), TypeError, "name must be a collective's name (str) or None, got int"),
    (lambda hcc, p: hcc.compile(123), TypeError, "program must be a Program, a path or source text, got int"),
    (lambda hcc, p: hcc.compile(p, model=3), TypeError, "model must be a CostModel or None, got int"),
    (lambda hcc, p: hcc.compile(p, modle=None), TypeError, "unexpected keyword argument 'modle' (did you mean 'model'?)"),
    (lambda hcc, p: hcc.compile_all(p, nme="r"), TypeError, "unexpected keyword argument 'nme'"),
    (lambda hcc, p: hcc.compile_all(None), TypeError, "program must be a Program"),
    (lambda hcc, p: hcc.load(None), TypeError, "hcc.load: expected a path or the program's source text"),
    (lambda hcc, p: hcc.load(b"topology t {}"), TypeError, "got bytes"),
    (lambda hcc, p: hcc.load(API_SRC, strict=True), TypeError, "unexpected keyword argument 'strict'"),
    (lambda hcc, p: hcc.Plan.load(None), TypeError, "expected a path"),
    (lambda hcc, p: hcc.CostModel(per_message_s=-1), ValueError, "per_message_s must be a finite number >= 0, got -1"),
    (lambda hcc, p: hcc.CostModel(per_message_s=float("nan")), ValueError, "got nan"),
    (lambda hcc, p: hcc.CostModel(reduce_Bps=float("inf")), ValueError, "got inf"),
    (lambda hcc, p: hcc.CostModel(copy_Bps="fast"), TypeError, "copy_Bps must be a number, got str"),
    (lambda hcc, p: hcc.CostModel(per_message_s=True), TypeError, "got bool"),
])
def test_api_misuse_is_a_typed_error(call, kind, fragment):
    """Wrong argument types and values used to give a raw TypeError ("'int' object is not
    iterable"), a false "deadlock" (a negative per-message cost) or a silent 0.0 s prediction
    (NaN); each is now an hcc error that is also the built-in TypeError/ValueError."""
    import hcc

    program = hcc.load(API_SRC)
    with pytest.raises(hcc.ArgumentError) as e:
        call(hcc, program)
    assert isinstance(e.value, kind) and isinstance(e.value, hcc.HccError)
    assert fragment in str(e.value), str(e.value)


def test_api_accepts_what_it_documents():
    import numpy as np

    import hcc

    program = hcc.load(API_SRC)
    plan = hcc.compile(program, "r", model=hcc.CostModel(per_message_s=np.float64(1e-6)))
    assert plan.figures.predicted_s > 0
    assert set(hcc.compile_all(API_SRC, model=None)) == {"r"}
