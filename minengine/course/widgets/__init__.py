"""ipywidgets front ends used by the lessons (need the ``course`` extra: ipywidgets, matplotlib).

One widget per lesson's main "what if"; each lives in its own module, which the lessons import directly.
"""

from minengine.course.widgets.batching_widget import BatchingWidget
from minengine.course.widgets.capacity_widget import CapacityWidget
from minengine.course.widgets.chunking_widget import ChunkingWidget
from minengine.course.widgets.experiments import TwoPhasesWidget
from minengine.course.widgets.goodput_widget import GoodputWidget
from minengine.course.widgets.kv_widget import KVCalculatorWidget, kv_calculator
from minengine.course.widgets.latency_widget import LatencyWidget
from minengine.course.widgets.prefix_widget import PrefixWidget
from minengine.course.widgets.roofline_widget import RooflineWidget

__all__ = [
    "BatchingWidget",  # lesson 05
    "CapacityWidget",  # lesson 09
    "ChunkingWidget",  # lesson 06
    "GoodputWidget",  # lesson 08
    "KVCalculatorWidget",  # lesson 04
    "LatencyWidget",  # lesson 03
    "PrefixWidget",  # lesson 07
    "RooflineWidget",  # lesson 02
    "TwoPhasesWidget",  # lessons 00-01
    "kv_calculator",
]
