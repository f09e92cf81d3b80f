"""Reading the peers' job configs into RPEG and writing RPEG's plans as the peers' configs.

`common` holds the neutral view both directions share (PlanView); one module per system reads and
writes that system's config:

    read(text, source, *, model=None, response_mean=None, cluster=None) -> Imported
    project(view) -> (view as the system can run it, one line per change)
    write(view) -> Exported        # projects first; the text names what it leaves out

Nothing here imports torch or ray.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from rpeg.errors import RpegError

SYSTEMS = ("verl", "openrlhf", "areal")


def system(name: str) -> ModuleType:
    """The adapter module of a peer system."""
    if name not in SYSTEMS:
        raise RpegError(f"unknown system {name!r} (RPEG reads and writes {', '.join(SYSTEMS)})")
    return importlib.import_module(f"rpeg.interop.{name}")
