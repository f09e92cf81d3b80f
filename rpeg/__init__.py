"""RPEG: plan and run RL post-training of reasoning language models from one graph IR.

The planning core (``graph``, ``algorithms``, ``passes``, ``analysis``, ``hardware``, ``perf``,
``sim``, ``search``) imports neither torch nor ray; the runtime does.
"""

from rpeg.errors import RpegError

__version__ = "0.1.0"
__all__ = ["RpegError", "__version__"]
