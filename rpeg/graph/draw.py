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


def draw_png(g: Graph, path: str, title: str | None = None) -> str:
    """Draw the graph to a PNG file; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Patch

    layer = _layers(g)
    columns: dict[int, list[str]] = {}
    for n in g.topo_order():
        columns.setdefault(layer[n], []).append(n)
    ncol = max(columns) + 1
    nrow = max(len(v) for v in columns.values())
    box_w, box_h, gap_x, gap_y = 2.3, 1.25, 1.5, 0.6
    pos = {}
    for c, names in columns.items():
        offset = (nrow - len(names)) * (box_h + gap_y) / 2
        for r, n in enumerate(names):
            pos[n] = (c * (box_w + gap_x), -(offset + r * (box_h + gap_y)))
    width = ncol * (box_w + gap_x)
    height = nrow * (box_h + gap_y) + 1.6
    fig, ax = plt.subplots(figsize=(max(8.0, width * 0.95), max(3.5, height * 0.95)))
    ax.set_xlim(-0.4, width - gap_x + 0.4)
    ax.set_ylim(-height + 0.6, 1.5)
    ax.axis("off")
    for group in g.fusion:
        xs = [pos[s][0] for s in group]
        ys = [pos[s][1] for s in group]
        ax.add_patch(FancyBboxPatch((min(xs) - 0.15, min(ys) - box_h - 0.15), max(xs) - min(xs) + box_w + 0.3,
                                    max(ys) - min(ys) + box_h + 0.3, boxstyle="round,pad=0.05",
                                    fill=False, linestyle=":", linewidth=1.5, edgecolor="#555555"))
    streams = {(st.producer, st.consumer): st.microbatches for st in g.streams}
    for e in g.data_edges():
        (x0, y0), (x1, y1) = pos[e.src], pos[e.dst]
        start, end = (x0 + box_w, y0 - box_h / 2), (x1, y1 - box_h / 2)
        lw = 2.4 if (e.src, e.dst) in streams else 1.0
        ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", lw=lw, color="#444444",
                                                              shrinkA=0, shrinkB=0))
        label = human_bytes(e.bytes) + (f" x{streams[(e.src, e.dst)]}" if (e.src, e.dst) in streams else "")
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.08, label, fontsize=6.5, ha="center",
                color="#333333", bbox=dict(facecolor="white", edgecolor="none", pad=0.5, alpha=0.8))
    for e in g.weight_edges():
        if e.src == e.dst:
            continue
        (x0, y0), (x1, y1) = pos[e.src], pos[e.dst]
        start, end, rad = (x0 + box_w / 2, y0), (x1 + box_w / 2, y1), 0.25
        ax.annotate("", xy=end, xytext=start,
                    arrowprops=dict(arrowstyle="-|>", lw=1.1, color="#7f3fbf", linestyle="--",
                                    connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))
        dx, dy = end[0] - start[0], end[1] - start[1]  # the arc's midpoint: chord midpoint + rad/2 * normal
        ax.text((start[0] + end[0]) / 2 + rad / 2 * dy, (start[1] + end[1]) / 2 - rad / 2 * dx,
                _weight_label(e.model, e.distance), fontsize=6.5, color="#7f3fbf", ha="center", va="center",
                bbox=dict(facecolor="white", edgecolor="none", pad=0.3, alpha=0.85))
    for s in g.stages:
        x, y = pos[s.name]
        ax.add_patch(FancyBboxPatch((x, y - box_h), box_w, box_h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                    facecolor=COLORS[s.kind], edgecolor="#333333", linewidth=1.0))
        ax.text(x + box_w / 2, y - box_h / 2, stage_label(g, s), ha="center", va="center", fontsize=7.5)
    handles = [Patch(facecolor=c, edgecolor="#333333", label=k.value) for k, c in COLORS.items()
               if any(s.kind is k for s in g.stages)]
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(handles), frameon=False)
    ax.set_title(title or f"{g.algorithm}: {g.job.describe()}", fontsize=9, loc="left")
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path
