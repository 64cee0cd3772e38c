"""hcc.ir.viz_draw — a plan's panels drawn to PNG or SVG, one panel after another in order.

Terms:

- **panel layout**: where the vertices of one panel go. Each panel is laid out alone — by
  Graphviz's ``dot`` (one ``dot`` call per panel, hosts as clusters) when it is on PATH, else
  by hcc's own layout (:func:`own_layout`) — so no layout engine can reorder the panels:
  one graph holding all panels had dot scatter a 69-vertex plan's trees as T1, T0, T4, T7.
- **grid**: the panels placed left to right in index order (topology, T0, T1, ...), a new row
  when the next panel would pass the picture's width (:func:`grid`); under the picture's title
  a **legend** line says what the marks mean, above the panels, so it covers no vertex.

With ``dot``, each panel is rendered by dot and the pictures are composed: PNG by Pillow
(matplotlib's image library, pixel for pixel), SVG as text (each panel's ``<svg>`` nested at its place).
Without dot (or, for PNG, without matplotlib's image reader) see :func:`draw`.
"""
from __future__ import annotations

import io
import math
import re
import shutil
import subprocess

from .errors import ArgumentValueError, HccError
from .plan import Plan
from .viz_dot import panel_dots, to_dot
from .viz_scene import CUT_COLOR, _Scene, _scene

__all__ = ["VizError", "render", "grid", "own_layout", "LEGEND"]


class VizError(HccError):
    """Graphviz's ``dot`` refused the picture (its message follows)."""


LEGEND = ("double ring: root  |  red links, labelled: the bottleneck cut (its side S shaded red)  |  "
          "3-D box: a host (rack, server) drawn whole  |  grey box: a host's vertices  |  "
          "arrows: a tree, parent to child")
_BOXES = ("  |  3-D box: a host (rack, server) drawn whole", "  |  grey box: a host's vertices")
# pixels between panels, and the picture's width as a multiple of its height it aims for
# (16:10 fits a screen; a single tall panel, fattree1024's rack column, stays as tall as it is)
GAP_PX = 24
ASPECT = 1.6


def grid(sizes: list[tuple[float, float]], gap: float = GAP_PX,
         aspect: float = ASPECT) -> tuple[list[tuple[float, float]], tuple[float, float]]:
    """Top-left corners of panels of ``sizes`` (width, height), in reading order: left to right,
    a new row when the next panel would pass the width (about ``aspect`` times the height the
    panels' total area gives, never narrower than the widest panel). Returns the corners and
    the (width, height) of the whole.

    >>> grid([(100, 50), (100, 50), (100, 50)], gap=0, aspect=1.0)
    ([(0, 0), (100, 0), (0, 50)], (200, 100))
    """
    if not sizes:
        return [], (0, 0)
    area = sum((w + gap) * (h + gap) for w, h in sizes)
    width = max(max(w for w, _ in sizes), math.sqrt(area * aspect))
    out, x, y, row_h, right = [], 0, 0, 0, 0
    for w, h in sizes:
        if x > 0 and x + w > width:
            x, y, row_h = 0, y + row_h + gap, 0
        out.append((x, y))
        right = max(right, x + w)
        x, row_h = x + w + gap, max(row_h, h)
    return out, (right, y + row_h)


def _title(scene: _Scene) -> str:
    return scene.title + (f"\n{scene.hidden_trees} more trees not drawn" if scene.hidden_trees else "")


def _dot(src: str, fmt: str) -> bytes:
    # 120 s: fattree1024's largest panel (32 racks and an opened rack) lays out in about a
    # second; a bound, not a target
    r = subprocess.run(["dot", f"-T{fmt}"], input=src.encode(), capture_output=True, timeout=120)
    if r.returncode != 0:
        raise VizError(f"dot -T{fmt} failed: {r.stderr.decode(errors='replace')[:500]}")
    return r.stdout


def render(plan: Plan, fmt: str, engine: str | None = None) -> bytes:
    """The picture's bytes. ``engine``: ``dot`` (each panel laid out by Graphviz, the default
    when ``dot`` is on PATH) or ``matplotlib`` (hcc's own layout). A PNG with dot but without
    Pillow (matplotlib's image library; the viz extra) is dot's drawing of :func:`to_dot`, all panels in one graph."""
    if fmt not in ("png", "svg"):
        raise ArgumentValueError(f"cannot draw {fmt!r}: png or svg")
    if engine is None:
        engine = "dot" if shutil.which("dot") else "matplotlib"
    if engine not in ("dot", "matplotlib"):
        raise ArgumentValueError(f"unknown engine {engine!r}: dot or matplotlib")
    scene = _scene(plan)
    if engine == "matplotlib":
        return _draw_matplotlib(plan, scene, fmt)
    panels = [_dot(src, fmt) for src in panel_dots(plan, scene)]
    if fmt == "svg":
        return _compose_svg(scene, panels)
    try:
        import PIL  # noqa: F401  (comes with matplotlib, the viz extra)
    except ImportError:
        return _dot(to_dot(plan), fmt)
    return _compose_png(scene, panels)


def _header(scene: _Scene) -> list[str]:
    """The title's lines and the legend, naming only the marks this picture has."""
    legend = LEGEND
    if not scene.aggregated:
        legend = legend.replace(_BOXES[0], "")
    if not any(v.host for v in scene.verts.values()) and not scene.aggregated:
        legend = legend.replace(_BOXES[1], "")
    return _title(scene).split("\n") + [legend]


def _compose_png(scene: _Scene, panels: list[bytes]) -> bytes:
    """Paste the panels' PNGs on one canvas with Pillow (matplotlib's image library: pasting
    pixels, where matplotlib's ``figimage`` resampled fattree1024's three panels for 15 s)
    and write the title and legend in matplotlib's DejaVu Sans."""
    from matplotlib import font_manager
    from PIL import Image, ImageDraw, ImageFont

    imgs = [Image.open(io.BytesIO(b)).convert("RGB") for b in panels]
    corners, (w, h) = grid([im.size for im in imgs])
    head = _header(scene)
    sizes = [15] * (len(head) - 1) + [12]
    fonts = [ImageFont.truetype(font_manager.findfont("DejaVu Sans"), sz) for sz in sizes]
    top = sum(sz + 6 for sz in sizes) + GAP_PX
    widths = [ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(t, font=f) for t, f in zip(head, fonts)]
    width = int(max(w, *widths)) + 2 * GAP_PX
    canvas = Image.new("RGB", (width, int(h + top + GAP_PX)), "white")
    pen = ImageDraw.Draw(canvas)
    y = GAP_PX // 2
    for text, font, sz, tw in zip(head, fonts, sizes, widths):
        pen.text(((width - tw) / 2, y), text, font=font, fill="#444444" if font is fonts[-1] else "black")
        y += sz + 6
    for im, (x, y) in zip(imgs, corners):
        canvas.paste(im, (int(GAP_PX + x), int(top + y)))
    buf = io.BytesIO()
    canvas.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


_SVG_SIZE = re.compile(r'<svg\b[^>]*?width="([\d.]+)pt"[^>]*?height="([\d.]+)pt"[^>]*?viewBox="([^"]+)"[^>]*>', re.S)


def _compose_svg(scene: _Scene, panels: list[bytes]) -> bytes:
    """Each panel's ``<svg>`` nested in one outer ``<svg>`` at its grid place (units: points,
    as dot writes them; ids prefixed per panel so that no two elements share one)."""
    from xml.sax.saxutils import escape

    bodies, sizes = [], []
    for k, b in enumerate(panels):
        text = b.decode()
        m = _SVG_SIZE.search(text)
        if m is None:
            raise VizError("dot -Tsvg wrote no <svg> with its size")
        w, h, vb = float(m.group(1)), float(m.group(2)), m.group(3)
        inner = text[m.end():text.rindex("</svg>")].replace(' id="', f' id="p{k}_')
        bodies.append((w, h, vb, inner))
        sizes.append((w, h))
    gap = GAP_PX * 0.75  # points
    corners, (w, h) = grid(sizes, gap=gap)
    head = _header(scene)
    line = 15.0
    top = line * len(head) + gap
    width = max(w, 5.2 * len(LEGEND)) + 2 * gap
    height = h + top + gap
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
           f'width="{width:.0f}pt" height="{height:.0f}pt" viewBox="0 0 {width:.1f} {height:.1f}">',
           f'<rect width="{width:.1f}" height="{height:.1f}" fill="white"/>']
    for i, text in enumerate(head):
        legend = i == len(head) - 1
        out.append(f'<text x="{width / 2:.1f}" y="{gap / 2 + line * (i + 0.75):.1f}" text-anchor="middle" '
                   f'font-family="Helvetica,sans-serif" font-size="{8 if legend else 10}" '
                   f'fill="{"#444444" if legend else "black"}">{escape(text)}</text>')
    for (pw, ph, vb, inner), (x, y) in zip(bodies, corners):
        out.append(f'<svg x="{gap + x:.1f}" y="{top + y:.1f}" width="{pw:.1f}" height="{ph:.1f}" viewBox="{vb}">')
        out.append(inner)
        out.append("</svg>")
    out.append("</svg>")
    return ("\n".join(out) + "\n").encode()


# ---------------------------------------------------------------- hcc's own layout
def own_layout(scene: _Scene, k: int) -> dict[str, tuple[float, float]]:
    """Positions of panel ``k``'s vertices without Graphviz. The topology panel: each host's
    vertices on a small circle, hosts on a grid, the vertices outside hosts (switches: spines,
    a ToR) on a row above them; no hosts: switches in the middle, the rest on a circle. A tree
    panel: layered from its root, one row per depth, each vertex under its parent."""
    if k == 0:
        return _topology_layout(scene, list(scene.verts))
    p = scene.panels[k - 1]
    used = [s for s in scene.verts if s in p.used()] + [s for s in scene.inner if s in p.used()]
    if p.links is not None:  # the cut panel: drawn as the topology is
        return _topology_layout(scene, used)
    children: dict[str, list[str]] = {}
    for a, b in p.edges:
        children.setdefault(a, []).append(b)
    depth = {p.root: 0} if p.root else {}
    order = list(depth)
    for v in order:  # breadth first; a vertex keeps its first (shallowest) depth
        for c in children.get(v, ()):
            if c not in depth:
                depth[c] = depth[v] + 1
                order.append(c)
    last = max(depth.values(), default=-1)
    for v in used:  # not reached from the root (switch hops of a baseline's tree): a last row
        depth.setdefault(v, last + 1)
    rows: dict[int, list[str]] = {}
    for v in order + [v for v in used if v not in order]:
        rows.setdefault(depth[v], []).append(v)
    pos = {}
    for d, row in sorted(rows.items()):
        for i, v in enumerate(row):
            pos[v] = (1.6 * (i - (len(row) - 1) / 2), -1.4 * d)
    return pos


def _topology_layout(scene: _Scene, ids: list[str]) -> dict[str, tuple[float, float]]:
    hosts: dict[str, list[str]] = {}
    for sid in ids:
        hosts.setdefault(scene.vertex(sid).host, []).append(sid)
    pos: dict[str, tuple[float, float]] = {}
    named = [h for h in hosts if h]
    cols = max(1, math.ceil(math.sqrt(len(named)))) if named else 1
    for k, h in enumerate(named):
        cx, cy = 3.8 * (k % cols), -3.8 * (k // cols)
        vs = hosts[h]
        for i, v in enumerate(vs):
            a = math.pi / 2 - 2 * math.pi * i / max(1, len(vs))
            r = 0.0 if len(vs) == 1 else 1.0
            pos[v] = (cx + r * math.cos(a), cy + r * math.sin(a))
    free = hosts.get("", [])
    if named:
        width = 3.8 * (cols - 1)
        for i, v in enumerate(free):
            pos[v] = (width * (i + 0.5) / max(1, len(free)) if len(free) > 1 else width / 2, 2.6)
        return pos
    # no hosts drawn as boxes: switches in the middle, the rest on a circle around them
    hubs = [v for v in free if scene.vertex(v).kind == "switch" or
            (scene.vertex(v).kind == "group" and "switches" in scene.vertex(v).label)]
    outer = [v for v in free if v not in hubs]
    radius = max(2.0, 0.4 * len(outer))  # ~0.6 units of arc per vertex keeps labels apart
    for ring, r in ((outer, radius), (hubs, 0.0 if len(hubs) == 1 else 0.6)):
        for i, v in enumerate(ring):
            a = math.pi / 2 - 2 * math.pi * i / max(1, len(ring))
            pos[v] = (r * math.cos(a), r * math.sin(a))
    return pos


def _draw_matplotlib(plan: Plan, scene: _Scene, fmt: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    # every panel at one scale, 0.6 in a layout unit (1.6 units between the vertices of a
    # tree's row: 1 in, room for an 8-character label at 6 pt), so no marker or label crowds
    # another however many vertices a panel has; panels placed by grid(), in index order
    layouts = [own_layout(scene, k) for k in range(1 + len(scene.panels))]
    inch, pad, title_in, gap = 0.6, 1.0, 0.55, 0.3
    boxes, sizes = [], []
    for pos in layouts:
        xs, ys = [x for x, _ in pos.values()] or [0.0], [y for _, y in pos.values()] or [0.0]
        box = (min(xs) - pad, max(xs) + pad, min(ys) - pad - 0.4, max(ys) + pad)  # labels hang below
        boxes.append(box)
        sizes.append(((box[1] - box[0]) * inch, (box[3] - box[2]) * inch + title_in))
    corners, (gw, gh) = grid(sizes, gap=gap)
    head_in = 0.25 * (len(_header(scene)) + 1)
    fw, fh = gw + 2 * gap, gh + head_in + gap
    fig = plt.figure(figsize=(fw, fh))
    axes = []
    for (x, y), (w, h), box in zip(corners, sizes, boxes):
        ax = fig.add_axes(((gap + x) / fw, (fh - head_in - y - h) / fh, w / fw, (h - title_in) / fh))
        ax.set_xlim(box[0], box[1])
        ax.set_ylim(box[2], box[3])
        ax.axis("off")
        axes.append(ax)

    def verts(ax, pos, used, shade=frozenset(), root=None):
        for h in {scene.vertex(s).host for s in used} - {""}:
            mine = [s for s in used if scene.vertex(s).host == h]
            x0, x1 = min(pos[s][0] for s in mine) - 0.5, max(pos[s][0] for s in mine) + 0.5
            y0, y1 = min(pos[s][1] for s in mine) - 0.5, max(pos[s][1] for s in mine) + 0.5
            if any(x0 < pos[s][0] < x1 and y0 < pos[s][1] < y1 for s in used if s not in mine):
                continue  # a layered tree mixes hosts: a box would enclose others' vertices
            ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0.1",
                                        fc="#f4f4f4", ec="#aaaaaa", zorder=0))
            ax.text(x0, y1 + 0.2, h, fontsize=8, color="#555555", zorder=5)
        for s in used:
            vx = scene.vertex(s)
            x, y = pos[s]
            marker = "s" if vx.kind in ("switch", "group") else "o"
            fc = "#eeeeee" if vx.kind == "switch" else ("white" if vx.kind == "node" else "#dde8f7")
            if s in shade:
                fc = "#f9d0cc"
            ringed = vx.root if root is None else s == root
            ax.scatter([x], [y], s=260, marker=marker, color=fc, edgecolors="black",
                       linewidths=2.5 if ringed else 0.8, zorder=3)
            label = vx.label + ("\n(root)" if ringed and vx.kind != "group" else "")
            ax.annotate(label, (x, y), xytext=(0, -13), textcoords="offset points", ha="center", va="top",
                        fontsize=6, zorder=4)

    def links(ax, pos, links, cut):
        for (a, b), (cap, _) in links.items():
            (x0, y0), (x1, y1) = pos[a], pos[b]
            red = (a, b) in cut
            ax.plot([x0, x1], [y0, y1], color=CUT_COLOR if red else "#c8c8c8", lw=2.5 if red else 0.8, zorder=1)

    ax = axes[0]
    pos = layouts[0]
    links(ax, pos, scene.links, scene.cut)
    verts(ax, pos, list(scene.verts), shade=scene.cut_side)
    ax.set_title("topology" + ("\n" + scene.cut_label.replace("; ", "\n") if scene.cut_label else ""), fontsize=8,
                 color=CUT_COLOR if scene.cut_label else "black")
    for k, p in enumerate(scene.panels, 1):
        ax = axes[k]
        pos = layouts[k]
        if p.links is not None:
            links(ax, pos, p.links, p.cut)
            verts(ax, pos, list(pos), shade=p.cut_side, root=p.root)
            ax.set_title(p.title, fontsize=8, color=p.color)
            continue
        for (a, b) in p.edges:
            ax.annotate("", xy=pos[b], xytext=pos[a], zorder=2,
                        arrowprops=dict(arrowstyle="-|>", color=p.color, lw=1.6, shrinkA=8, shrinkB=8))
        verts(ax, pos, list(pos), root=p.root)
        ax.set_title(p.title, fontsize=8, color=p.color)
    fig.text(0.5, 1 - 0.1 / fh, "\n".join(_header(scene)), ha="center", va="top", fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)
    return buf.getvalue()
