#!/usr/bin/env bash
# The main job on the built-in lab fleet: bring up ct129 and ct200 (real systemd, sshd, sglang),
# show the fleet, move ct129 from NEXTN to DDTree, show it again. `fleetspec lab down` ends it.
set -euo pipefail
cd "$(dirname "$0")/.."
# the demo's hosts run bare units: the container hosts' image (a 2.8 GB import) is not built for it
FLEETSPEC_LAB_CONTAINERS=${FLEETSPEC_LAB_CONTAINERS:-0} bash scripts/setup.sh
fleetspec lab up --hosts ct129,ct200
fleetspec -i lab status --all
echo "demo: gate figures below come from the lab's stand-in engine: stand-in figures, never GPU results"
fleetspec -i lab deploy ct129 --algo ddtree --yes
fleetspec -i lab status --all
echo "Next: fleetspec -i lab history ct129; fleetspec -i lab rollback ct129; fleetspec lab down"
