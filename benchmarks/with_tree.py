"""Run a benchmark script against another checkout of minengine: the "before" half of a paired A/B.

    git archive eb52616 minengine | tar -x -C /tmp/base
    .venv/bin/python benchmarks/with_tree.py /tmp/base benchmarks/decode_floor.py --dtypes float32 --rounds 3

Why not PYTHONPATH: the project is installed in editable mode, and setuptools' editable finder sits on
``sys.meta_path`` ahead of ``sys.path``, so ``PYTHONPATH=/tmp/base`` still imports the working tree. This
drops that finder, puts the other tree first, checks where ``minengine`` came from, and runs the script
(from this checkout, so both halves measure with the same benchmark code).
"""

from __future__ import annotations

import os
import runpy
import sys


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit(__doc__)
    tree, script = os.path.abspath(argv[0]), argv[1]
    if not os.path.isdir(os.path.join(tree, "minengine")):
        sys.exit(f"{tree} holds no minengine/ folder "
                 f"(make it with: git archive <rev> minengine | tar -x -C {tree})")
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__name__.lower()
                        and "editable" not in (getattr(f, "__module__", "") or "").lower()]
    sys.path[:0] = [tree, os.path.dirname(os.path.abspath(script))]
    import minengine

    if not minengine.__file__.startswith(tree):
        sys.exit(f"minengine still imports from {minengine.__file__}, not {tree}")
    print(f"minengine from {os.path.dirname(minengine.__file__)}", flush=True)
    sys.argv = [script, *argv[2:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
