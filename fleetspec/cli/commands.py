"""The command modules; each exports COMMANDS, a list of click commands or groups."""

from __future__ import annotations

from fleetspec.cli import (
                           bench_cmd,
                           deploy_cmd,
                           history_cmd,
                           inventory_cmd,
                           kernels_cmd,
                           lab_cmd,
                           patchset_cmd,
                           status_cmd,
)

ALL = [*status_cmd.COMMANDS, *deploy_cmd.COMMANDS, *history_cmd.COMMANDS, *inventory_cmd.COMMANDS,
       *bench_cmd.COMMANDS, *patchset_cmd.COMMANDS,
       *kernels_cmd.COMMANDS, *lab_cmd.COMMANDS]
