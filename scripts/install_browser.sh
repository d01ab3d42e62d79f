#!/usr/bin/env sh
# Chromium for the browser tests (tests/browser/, `make test-browser`), installed the quiet, idempotent way.
#
# Run by `make test` and `make test-browser`. Where Chromium is already there, or we cannot install it
# (not root, no apt-get), it only says so: the browser tests then skip with a reason and the rest of the
# suite runs. It never fails the build, and never downloads a browser through Playwright: Debian's
# `chromium` package is the one the tests drive. Set MINENGINE_CHROMIUM=/path/to/chrome to use another.
set -u

for name in chromium chromium-browser google-chrome google-chrome-stable; do
    command -v "$name" >/dev/null 2>&1 && exit 0
done
if [ -n "${MINENGINE_CHROMIUM:-}" ] && [ -x "${MINENGINE_CHROMIUM}" ]; then
    exit 0
fi
exec sh "$(dirname "$0")/apt_install.sh" chromium \
    "for the browser tests; without it they are skipped, or set MINENGINE_CHROMIUM=/path/to/chromium"
