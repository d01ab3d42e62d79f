"""ipywidgets front ends used by the lessons (need the ``course`` extra: ipywidgets, matplotlib)."""

from minengine.course.widgets.experiments import TwoPhasesWidget
from minengine.course.widgets.kv_widget import KVCalculatorWidget, kv_calculator
from minengine.course.widgets.latency_widget import LatencyWidget

__all__ = ["KVCalculatorWidget", "LatencyWidget", "TwoPhasesWidget", "kv_calculator"]
