"""``python -m minengine``: the same as the ``minengine`` command."""

from minengine.cli import main

raise SystemExit(main())
