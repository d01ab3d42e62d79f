"""The ``minengine`` command: ``main`` builds the parser, one module per subcommand registers itself.

generate, serve, bench, kv, simulate; ``validators`` holds the argparse types they share.
"""
