"""``python -m minengine``: the same as the ``minengine`` command."""

from minengine.cli.main import main

raise SystemExit(main())
