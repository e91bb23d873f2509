#!/usr/bin/env bash
# The test command: installs what it needs (scripts/setup.sh), then runs the whole suite,
# unit tests and the end-to-end lab tests on real containers.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
bash scripts/setup.sh
echo "test: set-up took $((SECONDS - t0))s (cache ${FLEETSPEC_CACHE:-/var/cache/fleetspec})"
exec python3 -m pytest -p no:cacheprovider "$@"
