#!/usr/bin/env bash
# Set up a fresh machine for SpINA: Debian packages (when root and missing), a virtualenv,
# and the project with its test dependencies. Safe to run again.
set -euo pipefail
VENV=${1:-.venv}
PYTHON=${2:-python3}
cd "$(dirname "$0")/.."

# Debian packages the tests use: iproute2 (ip netns), iptables (loss injection), ethtool,
# mininet (mnexec and Debian's mininet module), cpp (the P4 agreement tests preprocess p4src/),
# tshark (the Lua dissector test; ~9 s here), prometheus (the real-scrape test; ~14 s) and tmux
# (the live status screen's test, through capture-pane);
# gcc and python3-dev build the C parts (host_agent/_core.c, softswitch/_datapath.c,
# host_agent/compression/_kernels.c; setup.py).
DEBS="iproute2 iptables ethtool mininet cpp tshark prometheus tmux gcc python3-dev"
missing=""
for p in $DEBS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian packages:$missing"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    # Debian starts a system-wide Prometheus on *:9090 (BMv2's Thrift port): the tests run
    # their own on loopback, so the service is stopped and disabled.
    if [[ " $missing " == *" prometheus "* ]] && command -v systemctl >/dev/null; then
      systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
  else
    echo "setup: warning: missing Debian packages:$missing (need root and apt-get); namespace tests will skip"
  fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
"$VENV/bin/python" -m pip install -q -e '.[test]' 2>&1 | grep -v '^WARNING: Location' || true
"$VENV/bin/python" -c "import numpy, torch, p4.v1.p4runtime_pb2, grpc, scapy, yaml
from host_agent import _core
from host_agent.compression import _kernels
from softswitch import _datapath
print('setup: ok, torch', torch.__version__, '- agent core', _core.VARIANT,
      '- compression kernels', _kernels.VARIANT, '- switch data path compiled')"
