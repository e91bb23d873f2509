#!/usr/bin/env bash
# Installs everything fleetspec, its tests and its lab need on a fresh Debian 12 machine (as root).
# Heavy artefacts (wheels, sglang environments, the lab image, kernels) are cached under
# /var/cache/fleetspec, so a warm machine finishes in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in openssh-server openssh-client debootstrap systemd-container iproute2; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "^WARNING: Running pip as" || true
python3 -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | grep -v "^WARNING: Running pip as" || true

# The sglang wheel cache, both versions' environments on this machine (for tests that run the
# real parsers), and the lab image (debootstrap + the same environments inside).
python3 -m fleetspec.lab.prepare
