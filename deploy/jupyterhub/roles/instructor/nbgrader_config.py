"""nbgrader for an instructor's server on the hub: the course directory lives in their home.

`python -m minengine.course release --course-dir ~/course` builds it (and writes its own
nbgrader_config.py there, read when nbgrader runs inside ~/course).
"""
import os

c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "minengine"
c.CourseDirectory.root = os.path.expanduser("~/course")
c.Exchange.root = os.environ.get("MINENGINE_EXCHANGE", "/srv/nbgrader/exchange")
