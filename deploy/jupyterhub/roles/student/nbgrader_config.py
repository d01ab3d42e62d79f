"""nbgrader for a student's server on the hub: the course and the exchange, nothing else."""
import os

c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "minengine"
c.Exchange.root = os.environ.get("MINENGINE_EXCHANGE", "/srv/nbgrader/exchange")
