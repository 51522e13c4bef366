#!/usr/bin/env bash
# Debian packages the tests and the demo need: redis-server and redis-tools (tests start their own on loopback), chromium
# (the browser tests drive it headless through playwright) and prometheus + promtool (the exporter tests start
# their own on loopback). Installs only what is missing.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# redis-cli joins the test cluster (tests/support/rediscluster.py), redis-benchmark gives `make bench` its baseline
command -v redis-cli >/dev/null 2>&1 && command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
if [ "${1:-}" = "--with-browser" ]; then  # the test-only tools: chromium for the pages, prometheus for the exporter
  [ -x /usr/bin/chromium ] || need+=(chromium)
  command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need+=(prometheus)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
  echo "missing Debian packages: ${need[*]} (install them: apt-get install -y ${need[*]})" >&2
  exit 1
fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "installing ${need[*]} with apt-get" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
