#!/usr/bin/env bash
# Installs everything fleetspec, its tests and its lab need on a fresh Debian 12 machine (as root).
# Heavy artefacts (wheels, sglang environments, the lab image, kernels) are cached under
# $FLEETSPEC_CACHE (default /var/cache/fleetspec), so a warm machine finishes in seconds and
# prints nothing; a cold one prints one line per stage with its seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

stage() {  # stage NAME COMMAND...: run it; say its seconds; one clear line if it fails
  local name=$1 t0=$SECONDS out; shift
  if ! out=$("$@" 2>&1); then
    echo "setup: $name failed: $(printf '%s\n' "$out" | grep -v '^\s*$' | tail -n 1)" >&2
    exit 2
  fi
  echo "setup: $name $((SECONDS - t0))s"
}

need_apt=()
for pkg in openssh-server openssh-client debootstrap systemd-container iproute2 build-essential; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  stage "apt-get update (Debian's package index)" apt-get update -qq
  stage "apt-get install ${need_apt[*]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

pip_quiet() { python3 -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Running pip as" ; return "${PIPESTATUS[0]}"; }
if ! python3 -c 'import torch' 2>/dev/null; then
  stage "pip install torch==2.13.0 (CPU wheel)" pip_quiet torch==2.13.0
fi
# Installed, with its dependencies, and editable from this very checkout (not another one's).
here=$PWD
if ! (cd / && python3 -c 'import sys, fleetspec, paramiko, jinja2, click, yaml, tenacity, rich, prometheus_client, packaging, pytest, hypothesis, pytest_timeout, ruff, mypy, mkdocs, material, matplotlib, sglang_router, jsonschema, kubernetes_validate
sys.exit(0 if fleetspec.__file__.startswith(sys.argv[1] + "/") else 1)' "$here") 2>/dev/null; then
  stage "pip install -e .[test] (fleetspec and its test tools, from PyPI)" pip_quiet -e '.[test]'
fi

# The sglang wheel cache, the lab image (debootstrap + one layer per sglang version), both
# versions' environments on this machine (tests run the real parsers) and the kernels.
python3 -m fleetspec.lab.prepare
