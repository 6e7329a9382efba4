#!/usr/bin/env bash
# Make sure `promtool` and `prometheus` are on PATH for the monitoring tests (tests/test_prometheus_*.py; make test
# runs this first). When either is missing: as root with apt-get, install the distribution's package `prometheus`
# (Prometheus 2.x; without its recommends, which would add a node exporter service); otherwise, or when apt-get
# fails, stop with one line saying what to install. A service the package's install scripts started (on a machine
# with an init system that allows it) is stopped again: the tests start their own Prometheus on a free port.
#   usage: bash scripts/ensure_prometheus.sh [--help]
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "ensure_prometheus.sh: unknown argument '$1'" >&2; exit 2 ;;
esac
WANT="Prometheus 2.x's promtool and prometheus on PATH (Debian/Ubuntu: apt-get install -y prometheus, as root)"
if command -v promtool > /dev/null && command -v prometheus > /dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
  echo "ensure_prometheus.sh: promtool or prometheus missing and not root with apt-get: install $WANT" >&2
  exit 1
fi
mkdir -p build
log=build/apt-prometheus.log
before=$(pgrep -x prometheus || true)
echo "ensure_prometheus.sh: installing the package prometheus (apt-get; log in $log)"
apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }
# a fresh container has no package lists: update once when the first install cannot find the package
if ! apt_install > "$log" 2>&1 && ! { apt-get update -q && apt_install; } >> "$log" 2>&1; then
  echo "ensure_prometheus.sh: apt-get install prometheus failed (see $log): install $WANT" >&2
  exit 1
fi
# the package's postinst may have started its service: stop it (by its init system, else the new processes)
started=$(comm -13 <(printf '%s\n' $before | sort) <(pgrep -x prometheus | sort) || true)
if [ -n "$started" ]; then
  if command -v systemctl > /dev/null && systemctl is-active --quiet prometheus 2> /dev/null; then
    systemctl stop prometheus || true
  elif command -v service > /dev/null; then
    service prometheus stop > /dev/null 2>&1 || true
  fi
  for pid in $started; do kill "$pid" 2> /dev/null || true; done
  echo "ensure_prometheus.sh: stopped the prometheus service the package started (pids $(echo $started))"
fi
if ! command -v promtool > /dev/null || ! command -v prometheus > /dev/null; then
  echo "ensure_prometheus.sh: the package prometheus installed no promtool / prometheus on PATH: install $WANT" >&2
  exit 1
fi
echo "ensure_prometheus.sh: $(promtool --version 2>&1 | head -n 1)"
