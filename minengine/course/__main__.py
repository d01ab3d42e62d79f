"""``python -m minengine.course <command>``: the course tooling (see ``minengine.course.tooling``)."""

from minengine.course.tooling import main

raise SystemExit(main())
