"""Graph <-> YAML/JSON. `load_graph(dump_graph(g)) == g` for every graph (tests check it)."""

from __future__ import annotations

from rpeg.errors import RpegError
from rpeg.graph.graph import Graph
from rpeg.graph.serde import dump_json, dump_yaml, from_data, parse_yaml
from rpeg.graph.verify import verify

FORMAT = "rpeg-graph/1"


def graph_to_yaml(graph: Graph) -> str:
    return f"# {FORMAT}\n" + dump_yaml(graph)


def graph_to_json(graph: Graph) -> str:
    return dump_json(graph)


def graph_from_text(text: str, source: str = "<string>") -> Graph:
    """Parse a graph from YAML or JSON text and verify it."""
    data = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise RpegError(f"{source}: expected a graph mapping, got {type(data).__name__}")
    graph = from_data(Graph, data)
    return verify(graph, f"{source}")
