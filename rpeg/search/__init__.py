"""Plan search: the joint search over structure, placement and layouts (search.py), the peer
systems' plans (baselines/), and a simple default plan (default.py)."""

from rpeg.search.layouts import LayoutCache, LayoutOptions
from rpeg.search.search import Candidate, NoFeasiblePlan, SearchResult, nearest_feasible, search
from rpeg.search.space import SpaceOptions

__all__ = ["Candidate", "LayoutCache", "LayoutOptions", "NoFeasiblePlan", "SearchResult", "SpaceOptions",
           "nearest_feasible", "search"]
