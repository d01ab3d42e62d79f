#!/usr/bin/env sh
# Bubblewrap, the sandbox autograde runs each student's kernel in (minengine/course/sandbox.py).
#
# Run by `make setup`, `make test` and `make autograde`. Where `bwrap` is already there, or we cannot
# install it (not root, no apt-get), it only says so: autograde then refuses to grade a class with a
# message that says what to install (`--no-sandbox` grades notebooks you trust without it), and the
# sandbox's own tests skip with that reason. It never fails the build.
set -u

if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "note: no bubblewrap (bwrap) here, so autograde cannot sandbox students' code: install your" \
         "system's bubblewrap package (Debian/Ubuntu: sudo apt-get install bubblewrap)"
    exit 0
fi

log="${TMPDIR:-/tmp}/minengine-bubblewrap-install.log"
echo "installing Debian's bubblewrap, the autograder's sandbox (apt-get, once) ..."
export DEBIAN_FRONTEND=noninteractive
if apt-get install -y -q bubblewrap >"$log" 2>&1 \
   || { apt-get update -q >>"$log" 2>&1 && apt-get install -y -q bubblewrap >>"$log" 2>&1; }; then
    echo "bubblewrap installed: $(command -v bwrap)"
else
    echo "note: could not install bubblewrap (log: $log); autograde will say what to do"
    tail -n 5 "$log" | sed 's/^/    /'
fi
exit 0
