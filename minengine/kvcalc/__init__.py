"""The KV-cache calculator (lab 1's reference): bytes per token, sequence and batch; capacity on a GPU.

``calculator`` holds the arithmetic, ``report`` turns an estimate into the table and the plain-English
story that ``minengine kv`` prints and the widget shows. Model facts (``KVSpec``, config.json and preset
loading) come from ``minengine.perf.model_spec``. No torch anywhere here.
"""

from minengine.kvcalc.calculator import *  # noqa: F403
from minengine.kvcalc.calculator import __all__  # noqa: F401
