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
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "note: no Chromium here, so the browser tests will be skipped (install your system's chromium" \
         "package, or set MINENGINE_CHROMIUM=/path/to/chromium)"
    exit 0
fi

log="${TMPDIR:-/tmp}/minengine-chromium-install.log"
echo "installing Debian's chromium for the browser tests (apt-get; about a minute, once) ..."
export DEBIAN_FRONTEND=noninteractive
# Try without refreshing the package lists first: it is quicker, and works offline with a warm cache.
if apt-get install -y -q chromium >"$log" 2>&1 \
   || { apt-get update -q >>"$log" 2>&1 && apt-get install -y -q chromium >>"$log" 2>&1; }; then
    echo "chromium installed: $(command -v chromium)"
else
    echo "note: could not install chromium (log: $log); the browser tests will be skipped"
    tail -n 5 "$log" | sed 's/^/    /'
fi
exit 0
