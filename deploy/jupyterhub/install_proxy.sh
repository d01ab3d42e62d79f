#!/bin/sh
# Install JupyterHub's proxy, configurable-http-proxy (npm), into a git-ignored folder of the project:
#   sh deploy/jupyterhub/install_proxy.sh [PREFIX]      (default PREFIX: build/hub-node)
# Idempotent: does nothing when the pinned version is already there. Needs node >= 18 and npm.
set -eu
VERSION="${CHP_VERSION:-5.3.0}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PREFIX="${1:-$ROOT/build/hub-node}"
BIN="$PREFIX/node_modules/.bin/configurable-http-proxy"
if [ -x "$BIN" ] && grep -q "\"version\": \"$VERSION\"" "$PREFIX/node_modules/configurable-http-proxy/package.json" 2>/dev/null; then
  echo "$BIN"
  exit 0
fi
command -v node >/dev/null 2>&1 || { echo "install_proxy.sh: node is not installed (JupyterHub's proxy needs it)" >&2; exit 1; }
command -v npm >/dev/null 2>&1 || { echo "install_proxy.sh: npm is not installed" >&2; exit 1; }
mkdir -p "$PREFIX"
npm install --silent --no-audit --no-fund --no-save --prefix "$PREFIX" "configurable-http-proxy@$VERSION" >&2
echo "$BIN"
