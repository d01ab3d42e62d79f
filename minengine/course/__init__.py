"""Everything the course adds around the engine: tooling (``python -m minengine.course``), nbgrader
grading, the checks labs and quizzes call, lesson helpers and the ipywidgets experiments.

Imported explicitly by module (``from minengine.course import lessons``); nothing here loads on
``import minengine``.
"""
