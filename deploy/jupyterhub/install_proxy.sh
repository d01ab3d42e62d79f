#!/bin/sh
# Install JupyterHub's proxy, configurable-http-proxy (npm), into a git-ignored folder of the project:
#   sh deploy/jupyterhub/install_proxy.sh [PREFIX]      (default PREFIX: build/hub-node)
# Idempotent: does nothing when the pinned version is already there. Needs node >= 18 and npm.
#
# Safe to run from several processes at once (pytest's workers each collect tests/test_hub.py): npm
# installs into a private folder that is renamed into place whole, so nobody ever starts a half-installed
# proxy. A CI run once failed that way: one worker started the hub while another's npm was still
# unpacking http-proxy-3 ("Cannot find package .../http-proxy-3/dist/lib/index.js").
set -eu
VERSION="${CHP_VERSION:-5.3.0}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PREFIX="${1:-$ROOT/build/hub-node}"
BIN="$PREFIX/node_modules/.bin/configurable-http-proxy"

installed() {
  [ -x "$BIN" ] && grep -q "\"version\": \"$VERSION\"" \
    "$PREFIX/node_modules/configurable-http-proxy/package.json" 2>/dev/null
}

if installed; then
  echo "$BIN"
  exit 0
fi
command -v node >/dev/null 2>&1 || { echo "install_proxy.sh: node is not installed (JupyterHub's proxy needs it)" >&2; exit 1; }
command -v npm >/dev/null 2>&1 || { echo "install_proxy.sh: npm is not installed" >&2; exit 1; }
mkdir -p "$(dirname "$PREFIX")"
# One installer at a time where flock(1) is there (util-linux, on every Linux that can run the hub).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$PREFIX.lock"
  flock 9
  if installed; then
    echo "$BIN"
    exit 0
  fi
fi
STAGING="$(mktemp -d "$PREFIX.staging.XXXXXX")"
chmod 755 "$STAGING"  # mktemp makes it private; the hub and its users read it as before
trap 'rm -rf "$STAGING"' EXIT
npm install --silent --no-audit --no-fund --no-save --prefix "$STAGING" "configurable-http-proxy@$VERSION" >&2
# npm's .bin links are relative, so the folder works under its final name.
rm -rf "$PREFIX"
mv "$STAGING" "$PREFIX" 2>/dev/null || installed || { echo "install_proxy.sh: could not move the proxy into $PREFIX" >&2; exit 1; }
echo "$BIN"
