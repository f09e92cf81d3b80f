"""Pictures of a graph: Graphviz DOT text, and a PNG drawn with matplotlib (no Graphviz needed).

Boxes are stages, coloured by kind; solid arrows are data edges labelled with their fields and
bytes per step (bold where streamed); dashed arrows are weight-version edges labelled with the
model and how many steps later the version is read; dotted frames are fusion groups.
"""

from __future__ import annotations

from rpeg.graph.graph import Graph
from rpeg.graph.nodes import Kind, Stage

COLORS = {
    Kind.GENERATE: "#8fbbe8", Kind.INFER: "#b5e3a8", Kind.TRAIN: "#f4a582", Kind.REWARD: "#f9e08b",
    Kind.COMPUTE: "#d9d9d9", Kind.SYNC: "#c9a8e3",
}


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def stage_label(g: Graph, s: Stage) -> str:
    runs = s.model or ("rule" if s.kind is Kind.REWARD else "")
    lines = [s.name, s.kind.value + (f" · {runs}" if runs else "")]
    if s.lag:
        lines.append(f"weights t-{s.lag}")
    if s.group:
        grp = g.group(s.group)
        lines.append(f"{grp.name}: gpus {grp.first}-{grp.first + grp.count - 1}")
    if s.layout:
        lines.append(s.layout.describe())
    if s.microbatches > 1:
        lines.append(f"{s.microbatches} micro-batches")
    return "\n".join(lines)


def _weight_label(model: str, distance: int) -> str:
    return f"{model} weights, same step" if distance == 0 else f"{model} weights, +{distance} step" + (
        "s" if distance > 1 else "")


def to_dot(g: Graph) -> str:
    q = lambda s: '"' + s.replace('"', r"\"").replace("\n", r"\n") + '"'  # noqa: E731
    out = [f"digraph {q(g.algorithm)} {{", "  rankdir=LR;", '  node [shape=box, style="rounded,filled", '
           'fontname="Helvetica", fontsize=10];', '  edge [fontname="Helvetica", fontsize=8];']
    for name in g.inputs:
        out.append(f"  {q('in:' + name)} [label={q(name)}, shape=plaintext, style=\"\"];")
    for i, group in enumerate(g.fusion):
        out.append(f'  subgraph "cluster_fused_{i}" {{ label="fused"; style=dotted;')
        out += [f"    {q(s)};" for s in group]
        out.append("  }")
    for s in g.stages:
        out.append(f"  {q(s.name)} [label={q(stage_label(g, s))}, fillcolor=\"{COLORS[s.kind]}\"];")
    streams = {(st.producer, st.consumer): st.microbatches for st in g.streams}
    for s in g.stages:
        for f in s.reads:
            if f in g.inputs:
                out.append(f"  {q('in:' + f)} -> {q(s.name)};")
    for e in g.data_edges():
        label = ", ".join(e.fields) + "\n" + human_bytes(e.bytes)
        extra = ""
        if (e.src, e.dst) in streams:
            label += f"\nstreamed x{streams[(e.src, e.dst)]}"
            extra = ", penwidth=2.5"
        out.append(f"  {q(e.src)} -> {q(e.dst)} [label={q(label)}{extra}];")
    for e in g.weight_edges():
        if e.src == e.dst:
            continue  # a training stage reading its own previous version: implied
        out.append(f"  {q(e.src)} -> {q(e.dst)} [style=dashed, color=\"#7f3fbf\", fontcolor=\"#7f3fbf\", "
                   f"constraint=false, label={q(_weight_label(e.model, e.distance))}];")
    out.append("}")
    return "\n".join(out) + "\n"


def _layers(g: Graph) -> dict[str, int]:
    preds = g.predecessors()
    layer: dict[str, int] = {}
    for n in g.topo_order():
        layer[n] = 1 + max((layer[p] for p in preds[n]), default=-1)
    sync = [s.name for s in g.stages if s.kind is Kind.SYNC]
    last = max(layer.values(), default=0)
    for n in sync:  # a sync follows the training it ships
        layer[n] = last + 1
    return layer


def _layout(g: Graph) -> tuple[dict[str, tuple[int, float]], dict[tuple[str, str], list[tuple[int, float]]]]:
    """A layered (Sugiyama-style) layout: columns by longest path, a dummy slot in every column an
    edge skips (so edges never cross boxes), rows ordered by the barycentre of neighbours.
    Returns each stage's (column, row) and each data edge's (column, row) waypoints."""
    layer = _layers(g)
    cols: dict[int, list[str]] = {}
    for n in g.topo_order():
        cols.setdefault(layer[n], []).append(n)
    waypoints: dict[tuple[str, str], list[str]] = {}
    neighbours: dict[str, list[str]] = {n: [] for n in layer}
    for e in g.data_edges():
        chain = [e.src]
        for c in range(layer[e.src] + 1, layer[e.dst]):
            dummy = f"\0{e.src}>{e.dst}@{c}"
            cols[c].append(dummy)
            neighbours[dummy] = []
            chain.append(dummy)
        chain.append(e.dst)
        for a, b in zip(chain, chain[1:]):
            neighbours[a].append(b)
            neighbours[b].append(a)
        waypoints[(e.src, e.dst)] = chain[1:-1]
    order = {n: float(i) for c in cols.values() for i, n in enumerate(c)}
    for sweep in range(8):  # barycentre heuristic, alternating directions
        ks = sorted(cols) if sweep % 2 == 0 else sorted(cols, reverse=True)
        for c in ks:
            def bary(n: str) -> float:
                ns = [order[m] for m in neighbours[n]]
                return sum(ns) / len(ns) if ns else order[n]
            cols[c].sort(key=lambda n: (bary(n), order[n]))
            for i, n in enumerate(cols[c]):
                order[n] = float(i)
    height = max(len(c) for c in cols.values())
    pos = {}
    for c, names in cols.items():
        offset = (height - len(names)) / 2
        for i, n in enumerate(names):
            pos[n] = (c, offset + i)
    nodes = {n: pos[n] for n in layer}
    paths = {k: [pos[d] for d in v] for k, v in waypoints.items()}
    return nodes, paths


def draw_png(g: Graph, path: str, title: str | None = None) -> str:
    """Draw the graph to a PNG file; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch
    from matplotlib.path import Path

    nodes, paths = _layout(g)
    box_w, box_h, step_x, step_y = 2.3, 1.25, 3.6, 1.75
    xy = lambda cr: (cr[0] * step_x, -cr[1] * step_y)  # noqa: E731  top-left corner of a slot
    ncol = max(c for c, _ in nodes.values()) + 1
    nrow = max(r for _, r in list(nodes.values()) + [p for ps in paths.values() for p in ps]) + 1
    back = [e for e in g.weight_edges() if e.src != e.dst and e.distance > 0]
    top = 0.9 + 0.55 * len(back)  # room above the boxes for weight edges that run back
    width, height = ncol * step_x - (step_x - box_w) + 0.3 + 0.12 * len(back), nrow * step_y + top
    fig, ax = plt.subplots(figsize=(max(8.0, width * 0.8), max(3.5, height * 0.8)))
    ax.set_xlim(-0.6 - 0.12 * len(back), width + 0.4)
    ax.set_ylim(-nrow * step_y + 0.2, top + 0.4)
    ax.axis("off")
    arrow = dict(arrowstyle="-|>", mutation_scale=10, shrinkA=0, shrinkB=0)

    for group in g.fusion:
        pts = [xy(nodes[s]) for s in group]
        x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts) + box_w
        y0, y1 = min(p[1] for p in pts) - box_h, max(p[1] for p in pts)
        ax.add_patch(FancyBboxPatch((x0 - 0.15, y0 - 0.15), x1 - x0 + 0.3, y1 - y0 + 0.3, boxstyle="round,pad=0.05",
                                    fill=False, linestyle=":", linewidth=1.5, edgecolor="#555555", zorder=0))
        ax.text(x0 - 0.1, y1 + 0.25, "fused", fontsize=7, color="#555555")

    streams = {(st.producer, st.consumer): st.microbatches for st in g.streams}
    for e in g.data_edges():
        (sx, sy), (dx, dy) = xy(nodes[e.src]), xy(nodes[e.dst])
        pts = [(sx + box_w, sy - box_h / 2)]
        for w in paths[(e.src, e.dst)]:  # pass through dummy slots: in at the left, out at the right
            wx, wy = xy(w)
            pts += [(wx, wy - box_h / 2), (wx + box_w, wy - box_h / 2)]
        pts.append((dx, dy - box_h / 2))
        lw = 2.4 if (e.src, e.dst) in streams else 1.0
        if len(pts) > 2:
            ax.plot([p[0] for p in pts[:-1]], [p[1] for p in pts[:-1]], color="#444444", lw=lw, zorder=1,
                    solid_capstyle="round")
        ax.add_patch(FancyArrowPatch(pts[-2], pts[-1], color="#444444", lw=lw, zorder=1, **arrow))
        label = human_bytes(e.bytes) + (f" x{streams[(e.src, e.dst)]}" if (e.src, e.dst) in streams else "")
        (ax0, ay0), (ax1, ay1) = pts[0], pts[1]
        ax.text(ax0 + (ax1 - ax0) * 0.35, ay0 + (ay1 - ay0) * 0.35, label, fontsize=6.5, ha="center", va="center",
                color="#333333", zorder=2, bbox=dict(facecolor="white", edgecolor="none", pad=0.5, alpha=0.85))

    purple = "#7f3fbf"
    for i, e in enumerate(back):  # train/sync -> readers at later steps: up through the column gaps, across the top
        (sx, sy), (dx, dy) = xy(nodes[e.src]), xy(nodes[e.dst])
        level = 0.5 + 0.55 * (i + 1)
        out_x, in_x = sx + box_w + 0.25 + 0.12 * i, dx - 0.25 - 0.12 * i
        yo, yi = sy - 0.2 - 0.1 * i, dy - 0.2 - 0.1 * i
        verts = [(sx + box_w, yo), (out_x, yo), (out_x, level), (in_x, level), (in_x, yi), (dx, yi)]
        ax.add_patch(FancyArrowPatch(path=Path(verts, [Path.MOVETO] + [Path.LINETO] * 5), color=purple, lw=1.1,
                                     linestyle="--", zorder=1, **arrow))
        ax.text((out_x + in_x) / 2, level, _weight_label(e.model, e.distance), fontsize=6.5, color=purple,
                ha="center", va="center", zorder=2, bbox=dict(facecolor="white", edgecolor="none", pad=0.3))
    for e in g.weight_edges():
        if e.distance == 0:  # e.g. sync right after training, same step
            (sx, sy), (dx, dy) = xy(nodes[e.src]), xy(nodes[e.dst])
            ax.add_patch(FancyArrowPatch((sx + box_w, sy - box_h * 0.8), (dx, dy - box_h * 0.8), color=purple,
                                         lw=1.1, linestyle="--", zorder=1, **arrow))

    for s in g.stages:
        x, y = xy(nodes[s.name])
        ax.add_patch(FancyBboxPatch((x, y - box_h), box_w, box_h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                    facecolor=COLORS[s.kind], edgecolor="#333333", linewidth=1.0, zorder=3))
        ax.text(x + box_w / 2, y - box_h / 2, stage_label(g, s), ha="center", va="center", fontsize=7.5, zorder=4)
    handles = [Patch(facecolor=c, edgecolor="#333333", label=k.value) for k, c in COLORS.items()
               if any(s.kind is k for s in g.stages)]
    handles.append(Patch(facecolor="white", edgecolor=purple, linestyle="--", label="weight version"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), fontsize=7, ncol=len(handles),
              frameon=False)
    fig.suptitle(title or f"{g.algorithm}: {g.job.describe()}", fontsize=9, x=0.01, ha="left")
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path
