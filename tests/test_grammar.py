"""The grammar and the AST: every form of language.md parses, with the spans and values the
front end relies on. Meaning (expansion, units, checks) is tested in test_frontend.py."""
from __future__ import annotations

from fractions import Fraction

import pytest

from hcc.grammar import ast
from hcc.grammar.diagnostics import SourceError
from hcc.grammar.parser import GRAMMAR_PATH, describe_expected, parse

from conftest import CLUSTER

# language.md's examples, verbatim
LANG_TOPOLOGY = """\
topology dgx1 {
    node gpu[0..7]                 # endpoints that can own data: gpu0 … gpu7
    switch pcie0, pcie1            # forwarding-only vertices (never own data)

    class nvlink = 25 GB/s, 1 us   # a named link class: bandwidth, latency (latency optional, default 0)

    gpu0 <-> gpu1 : nvlink         # full duplex: one link each way, each with the full bandwidth
    gpu0 <-> gpu3 : nvlink x2      # two parallel links (capacity adds up)
    gpu4 -> gpu5  : 10 GB/s        # one direction only
    gpu[0..3] <-> pcie0 : 12 GB/s, 5 us   # a range against a single vertex: a star
}
"""
LANG_CLUSTER = CLUSTER  # docs/language.md's hosts example
LANG_COLLECTIVES = """\
collective bcast = broadcast on dgx1 {
    ranks = gpu[0,1,3,6]       # participants, in rank order; default: every node (not switches)
    root  = gpu0               # rooted kinds only; default: the first rank
    size  = 500 MB             # the per-rank output buffer, as nccl-tests counts it
    dtype = float32            # float16 bfloat16 float32 float64 int8 int32 int64 uint8
}

collective grads = allreduce on dgx1 {
    size = 100 MB
    op   = sum                 # sum prod min max avg (reducing kinds only)
    algorithm  = auto          # auto | treepack | ring | tree | direct
    chunk      = auto          # pipelining granularity: auto or a size
    compress   = none          # none | fp16 | int8   (lossy relaxations; see design.md)
    on_failure = abort         # abort | continue     (what survivors do when a rank dies)
}
"""


def test_grammar_ships_next_to_the_module():
    assert GRAMMAR_PATH.name == "hcl.lark" and GRAMMAR_PATH.is_file()


def test_language_md_topology_parses():
    m = parse(LANG_TOPOLOGY, "lang.hcl")
    (t,) = m.topologies
    assert t.name == "dgx1"
    kinds = [type(s).__name__ for s in t.body]
    assert kinds == ["Decl", "Decl", "ClassDecl", "Link", "Link", "Link", "Link"]
    node, switch, cls, l1, l2, l3, l4 = t.body
    assert node.kind == "node" and node.refs[0].vertex.indices == (ast.Index(0, 7, node.refs[0].vertex.indices[0].span),)
    assert [r.text() for r in switch.refs] == ["pcie0", "pcie1"]
    assert cls.name == "nvlink" and cls.bandwidth.unit == "GB/s" and cls.latency.unit == "us"
    assert l1.arrow == "<->" and isinstance(l1.spec.bandwidth, ast.ClassRef) and l1.spec.mult is None
    assert l2.spec.mult == 2 and l2.spec.bandwidth.name == "nvlink"
    assert l3.arrow == "->" and l3.spec.bandwidth.text() == "10 GB/s"
    assert l4.src.text() == "gpu[0..3]" and l4.spec.latency.text() == "5 us"


def test_language_md_hosts_parse():
    (t,) = parse(LANG_CLUSTER).topologies
    host, tor, link = t.body
    assert isinstance(host, ast.Host) and host.part.text() == "h[0..3]"
    assert [type(s).__name__ for s in host.body] == ["Decl", "Decl", "Link"]
    assert link.src.host.text() == "h[0..3]" and link.src.vertex.text() == "nvs"
    assert link.spec.bandwidth.value == Fraction(25, 2)


def test_language_md_collectives_parse():
    m = parse(LANG_COLLECTIVES)
    bcast, grads = m.collectives
    assert (bcast.name, bcast.kind, bcast.topology) == ("bcast", "broadcast", "dgx1")
    assert [s.key for s in bcast.settings] == ["ranks", "root", "size", "dtype"]
    ranks = bcast.settings[0].value
    assert [(i.lo, i.hi) for i in ranks[0].vertex.indices] == [(0, 0), (1, 1), (3, 3), (6, 6)]
    assert [s.key for s in grads.settings] == ["size", "op", "algorithm", "chunk", "compress", "on_failure"]
    assert grads.settings[3].value[0].text() == "auto"


def test_spans_point_at_tokens():
    src = "topology t {\n  node a, b\n  a <-> b : 25 GB/s x2, 3 us\n}\n"
    link = parse(src).topologies[0].body[1]
    q = link.spec.bandwidth
    assert (q.span.line, q.span.col, q.span.end_col) == (3, 13, 20)
    assert (q.number_span.col, q.number_span.end_col) == (13, 15)
    assert (q.unit_span.col, q.unit_span.end_col) == (16, 20)
    assert (link.spec.mult_span.col, link.spec.mult_span.end_col) == (21, 23)
    assert (link.arrow_span.col, link.dst.span.col) == (5, 9)
    assert link.spec.latency.number_span.col == 25


def test_ranges_and_lists():
    m = parse("topology t { node gpu[0,3,5..6], nic0 }")
    ref, nic = m.topologies[0].body[0].refs
    assert [(i.lo, i.hi) for i in ref.vertex.indices] == [(0, 0), (3, 3), (5, 6)]
    assert nic.is_single and not ref.is_single


def test_units_attached_or_spaced():
    m = parse("collective c = allreduce on t { size = 64MiB chunk = 1024 B }")
    size, chunk = m.collectives[0].settings
    assert (size.value.number, size.value.unit) == ("64", "MiB")
    assert (chunk.value.number, chunk.value.unit) == ("1024", "B")


def test_numbers_decimal_exponent_negative():
    m = parse("topology t { class a = 12.5 GB/s, 1e3 ns  class b = -4 GB/s, .5 ms }")
    a, b = m.topologies[0].body
    assert a.bandwidth.value == Fraction(25, 2) and a.latency.value == 1000
    assert b.bandwidth.value == -4 and b.latency.value == Fraction(1, 2)


def test_newlines_and_whitespace_are_free():
    one_line = "topology t { node a, b switch s a <-> b : 1 GB/s a -> s : 2 GB/s, 1 us }"
    spread = "topology\n t\n{\n node a ,\n b\n\tswitch s\n a\n <->\n b\n :\n 1 GB/s\n a -> s : 2 GB/s ,\n 1 us\n}\n"
    def shape(m):
        out = []
        for s in m.topologies[0].body:
            if isinstance(s, ast.Link):
                out.append((s.src.text(), s.arrow, s.dst.text(), s.spec.bandwidth.text(),
                            s.spec.latency.text() if s.spec.latency else None))
            else:
                out.append((s.kind, tuple(r.text() for r in s.refs)))
        return out
    assert shape(parse(one_line)) == shape(parse(spread))


def test_a_setting_value_ends_at_the_line_when_it_lacks_a_unit():
    # `size = 100` then `op = sum`: the next line's word is the next key, not a unit
    m = parse("collective c = allreduce on t {\n size = 100\n op = sum\n}")
    size, op = m.collectives[0].settings
    assert size.value.unit == "" and op.key == "op"


def test_vertex_named_like_a_multiplicity_may_start_a_link():
    m = parse("topology t { node x2, y  y -> x2 : 1 GB/s x2\n x2 -> y : 1 GB/s }")
    l1, l2 = m.topologies[0].body[1:]
    assert l1.spec.mult == 2 and l2.src.text() == "x2"


def test_keywords_are_names_where_a_name_is_expected():
    m = parse("topology on { node node, switch } collective host = broadcast on on { size = 1 MB adaptive = on }")
    assert [r.text() for r in m.topologies[0].body[0].refs] == ["node", "switch"]
    assert m.collectives[0].settings[1].value[0].text() == "on"


def test_comments_anywhere():
    m = parse("# head\ntopology t { # c1\n node a # c2\n # c3\n}\n# tail")
    assert m.topologies[0].body[0].refs[0].text() == "a"


def test_empty_file_is_an_empty_module():
    assert parse("# nothing here\n").items == ()


@pytest.mark.parametrize(
    "src, fragment",
    [
        ("topology t { node a, }", "unexpected '}'; expected a name"),
        ("topology t { node a[0..] }", "expected an integer"),
        ("topology t { class c 5 GB/s }", "expected '='"),
        ("topology t { a <-> b : }", "expected a name or a number with its unit"),
        ("collective c = allreduce on t { size }", "expected '='"),
        ("collective c allreduce on t { }", "expected '='"),
        ("node a", "expected 'collective', 'topology' or the end of the file"),
    ],
)
def test_syntax_errors_say_what_was_expected(src, fragment):
    with pytest.raises(SourceError) as info:
        parse(src)
    assert fragment in info.value.message, info.value.message


def test_describe_expected_reads_as_english():
    assert describe_expected({"NAME"}) == "a name"
    assert describe_expected({"NAME", "RBRACE", "COMMA"}) == "a name, ',' or '}'"


def test_language_md_examples_load():
    from hcc.compiler.frontend import load_program

    t = load_program(LANG_CLUSTER).topologies["cluster"]
    assert len(t.nodes) == 32 and len(t.switches) == 5 and len(t.links) == 4 * 8 * 2 + 4 * 2
    # the dgx1 example links only gpu0..gpu5, so its bcast to gpu6 is rightly refused
    with pytest.raises(SourceError) as info:
        load_program(LANG_TOPOLOGY + LANG_COLLECTIVES)
    assert "rank 'gpu6' cannot be reached from the root 'gpu0'" in info.value.message
    assert info.value.span.line == LANG_TOPOLOGY.count("\n") + 2  # the ranks line
