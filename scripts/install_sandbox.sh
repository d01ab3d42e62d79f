#!/usr/bin/env sh
# Bubblewrap, the sandbox autograde runs each student's kernel in (minengine/course/sandbox.py).
#
# Run by `make setup`, `make test` and `make autograde`. Where `bwrap` is already there it does nothing;
# where it cannot be installed, autograde later refuses to grade a class with a message that says what
# to install (`--no-sandbox` grades notebooks you trust), and the sandbox's tests skip with that reason.
set -u
command -v bwrap >/dev/null 2>&1 && exit 0
exec sh "$(dirname "$0")/apt_install.sh" bubblewrap "the autograder's sandbox"
