#!/usr/bin/env sh
# JupyterHub's proxy (configurable-http-proxy, from npm) for tests/test_hub.py, installed before pytest
# starts so that no test downloads anything, and so that pytest's workers never race to install it.
#
# Run by `make test`. Only where the hub's tests can run (root, useradd, node and npm): elsewhere they
# skip with their own reason and this does nothing. It never fails the build: where npm cannot install
# the proxy it says so, and the hub's tests report it. `make test-hub` installs it with
# deploy/jupyterhub/install_proxy.sh itself, which does fail loudly.
set -u
[ "$(id -u)" = 0 ] || exit 0
for tool in useradd node npm; do
    command -v "$tool" >/dev/null 2>&1 || exit 0
done
sh "$(dirname "$0")/../deploy/jupyterhub/install_proxy.sh" >/dev/null \
    || echo "install_hub_proxy.sh: could not install configurable-http-proxy; the JupyterHub tests will say why" >&2
exit 0
