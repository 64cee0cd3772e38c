"""The documentation stays inside the repository and in step with it: every relative link of
README.md, BENCHMARKS.md and docs/*.md names a file that exists, nothing points outside the
repository, benchmarks/results/ holds exactly the files BENCHMARKS.md and the docs cite
(a results file nobody cites is history, which git keeps), and every error message that
docs/language.md shows is what the front end prints for the program it stands for."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hcc.compiler.frontend import load_program
from hcc.grammar.diagnostics import SourceError

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = ROOT / "benchmarks" / "results"

# [text](target) links, and `docs/x.md`-style mentions in prose
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
MENTION = re.compile(r"(?<![\w/.])((?:docs|examples|samples|benchmarks)/[\w./-]+\.(?:md|py|hcl))")


def _targets(doc: Path) -> list[tuple[str, Path]]:
    text = doc.read_text(encoding="utf-8")
    out = []
    for m in LINK.finditer(text):
        t = m.group(1)
        if "://" in t:
            continue
        out.append((t, (doc.parent / t).resolve()))
    for m in MENTION.finditer(text):
        out.append((m.group(1), (ROOT / m.group(1)).resolve()))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve_inside_the_repository(doc):
    for shown, path in _targets(doc):
        assert path.is_relative_to(ROOT), f"{doc.name}: {shown} points outside the repository"
        assert path.exists(), f"{doc.name}: {shown} does not exist"


def test_nothing_points_at_the_shared_folder():
    for doc in DOCS:
        assert "../shared" not in doc.read_text(encoding="utf-8"), doc.name


def _cited_results() -> set[str]:
    """Result file names the docs cite, with `name{,_x}.{json,csv}` shorthand expanded."""
    cited: set[str] = set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"[\w{},.*-]*\.(?:csv|json|png|txt|\{[\w,]+\})", text):
            word = m.group(0)
            names = [word]
            while any("{" in n for n in names):
                nxt = []
                for n in names:
                    b = re.search(r"\{([^{}]*)\}", n)
                    if not b:
                        nxt.append(n)
                        continue
                    nxt += [n[:b.start()] + alt + n[b.end():] for alt in b.group(1).split(",")]
                names = nxt
            for n in names:
                if "*" in n:
                    cited.update(p.name for p in RESULTS.glob(n))
                else:
                    cited.add(n)
    return cited


def test_results_folder_holds_only_cited_files():
    present = {p.name for p in RESULTS.iterdir() if p.is_file()}
    uncited = present - _cited_results()
    assert not uncited, f"benchmarks/results/ files no document cites: {sorted(uncited)}"


# ---- docs/language.md "Errors": each example's program, and the title it is shown under ----
# the topology most examples use (shown once at the top of the section)
T = "topology t {\n    node gpu[0..3]\n    switch sw\n    gpu[0..3] <-> sw : 10 GB/s\n}\n"


def C(body: str, kind: str = "allreduce") -> str:
    """A program of ``T`` and one collective ``c`` with ``body`` as its settings."""
    return T + f"collective c = {kind} on t {{\n{body}\n}}\n"


EXAMPLES = [
 # syntax
 ("syntax", "A missing `:` before a link's bandwidth", "topology t {\n    node a, b\n    a <-> b 10 GB/s\n}\n"),
 ("syntax", "A character that starts no token", "topology t {\n    node a, b\n    a <- b : 1 GB/s\n}\n"),
 ("syntax", "The file ends inside a block", "topology t {\n    node a, b\n    a <-> b : 1 GB/s\n"),
 ("syntax", "A missing `}` (the next block's first word is reported, with a hint)", "topology t {\n    node a, b\n    a <-> b : 1 GB/s\n\ncollective c = allreduce on t {\n    size = 1 MB\n}\n"),
 ("syntax", "A missing comma in a list", C("    ranks = gpu0 gpu1\n    size = 1 MB")),
 # names
 ("names", "Unknown vertex (with a did-you-mean)", T.replace("gpu[0..3] <-> sw", "gpu0 <-> gpo1")),
 ("names", "Unknown vertex produced by a range (the caret is on the range item)", T.replace("gpu[0..3] <-> sw", "gpu[0..4] <-> sw")),
 ("names", "Duplicate vertex", T.replace("switch sw", "switch sw, gpu2")),
 ("names", "Duplicate topology, collective, host, class or key", C("    size = 1 MB\n    size = 2 MB")),
 ("names", "Unknown topology", C("    size = 1 MB").replace("on t {", "on tt {")),
 ("names", "Unknown collective kind", C("    size = 1 MB", kind="allreduc")),
 ("names", "Unknown key", C("    sise = 1 MB")),
 ("names", "Unknown link class", T.replace(": 10 GB/s", ": nvlink")),
 ("names", "Unknown value of a word setting (dtype, op, algorithm, compress, on_failure, adaptive, peers)", C("    size = 1 MB\n    algorithm = treepak")),
 ("names", "A number where a word is expected", C("    size = 1 MB\n    dtype = 4")),
 ("names", "A qualified name declared outside its host", "topology c {\n    node h0.gpu0\n}\n"),
 ("names", "A range that counts down", T.replace("node gpu[0..3]", "node gpu[3..0]")),
 # links
 ("links", "A link to itself", T.replace("gpu[0..3] <-> sw", "gpu1 -> gpu1")),
 ("links", "Zero or negative bandwidth", T.replace(": 10 GB/s", ": 0 GB/s")),
 ("links", "Negative latency", T.replace(": 10 GB/s", ": 10 GB/s, -1 us")),
 ("links", "Multiplicity below 1", T.replace(": 10 GB/s", ": 10 GB/s x0")),
 # units
 ("units", "A unit of the wrong family", T.replace(": 10 GB/s", ": 10 GB")),
 ("units", "A missing unit (names the family expected)", C("    size = 100")),
 ("units", "An unknown unit (bits are `Gbit/s`)", T.replace(": 10 GB/s", ": 10 Gb/s")),
 # ranks and root
 ("ranks", "A root outside the ranks", C("    ranks = gpu[0..2]\n    root = gpu3\n    size = 1 MB", kind="broadcast")),
 ("ranks", "A switch used as a rank (or as the root)", C("    ranks = gpu0, sw, gpu1\n    size = 1 MB")),
 ("ranks", "A rank listed twice", C("    ranks = gpu[0..2], gpu1\n    size = 1 MB")),
 ("ranks", "`root` on a kind without a root", C("    root = gpu0\n    size = 1 MB", kind="allgather")),
 ("ranks", "A root that is a list or a range", C("    root = gpu[0..1]\n    size = 1 MB", kind="broadcast")),
 ("ranks", "Fewer than two ranks", C("    ranks = gpu2\n    size = 1 MB", kind="broadcast")),
 # kind-specific
 ("kind", "`op` on a kind that does not reduce", C("    size = 1 MB\n    op = max", kind="allgather")),
 ("kind", "`op = avg` on integers", C("    size = 1 MB\n    dtype = int32\n    op = avg")),
 ("kind", "`peers` on a kind other than neighbor_average", C("    size = 1 MB\n    peers = ring")),
 ("kind", "`peers = shift_one` with an odd rank count", C("    ranks = gpu[0..2]\n    size = 1 MB\n    peers = shift_one", kind="neighbor_average")),
 ("kind", "Compression of an integer buffer", C("    size = 1 MB\n    dtype = int64\n    compress = int8")),
 ("kind", "neighbor_average of an integer buffer", C("    size = 1 MB\n    dtype = uint8", kind="neighbor_average")),
 # sizes
 ("sizes", "A size that is not a multiple of the dtype", C("    size = 10 B\n    dtype = float64")),
 ("sizes", "A size that is not a whole number of bytes", C("    size = 1.5 B\n    dtype = uint8")),
 ("sizes", "A zero or negative size", C("    size = 0 MB")),
 ("sizes", "No size", C("    dtype = float32")),
 ("sizes", "An alltoall size that does not split into equal blocks", C("    size = 1000 B", kind="alltoall")),
 ("sizes", "A chunk that is not a multiple of the dtype, or not a size", C("    size = 1 MB\n    chunk = 6 B")),
 # connectivity
 ("reach", "A rank unreachable from the root (names the vertex and the cut)", "topology d {\n    node g[0..3]\n    g0 <-> g1 : 25 GB/s\n    g1 <-> g2 : 25 GB/s\n    g2 <-> g3 : 25 GB/s\n}\ncollective b = broadcast on d {\n    ranks = g0, g1, g3\n    size = 1 MB\n}\n"),
 ("reach", "Ranks that are not strongly connected (unrooted kinds)", "topology d {\n    node g[0..3]\n    g0 <-> g1 : 25 GB/s\n    g1 -> g2 : 25 GB/s\n    g2 <-> g3 : 25 GB/s\n}\ncollective a = allreduce on d {\n    size = 1 MB\n}\n"),
 # limits
 ("limits", "A range too large", T.replace("node gpu[0..3]", "node gpu[0..99999]")),
 ("limits", "A bandwidth beyond the limit", T.replace(": 10 GB/s", ": 1e30 GB/s")),
 ("limits", "A size beyond the limit", C("    size = 4096 TiB")),
]


@pytest.mark.parametrize("group, title, src", EXAMPLES, ids=[t for _, t, _ in EXAMPLES])
def test_language_doc_shows_the_real_error(group, title, src):
    with pytest.raises(SourceError) as info:
        load_program(src)
    rendered = info.value.render().replace("<string>", "plan.hcl")
    doc = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    assert f"{title}:\n\n```\n{rendered}\n```" in doc, rendered
