"""The host-changing parts of deploy and rollback, by step; ops/deploy.py says when each runs.

- stage (ops/staging.py): send what the host lacks, build releases/<id>/ aside, verify, rename;
- smoke (ops/smoke_run.py): the offline smoke tests in the host's python;
- render (ops/rendering.py): the drop-in and rollback.sh, and systemd-analyze on them;
- switch, restart, revert (ops/activation.py);
- plan and prune (ops/planning.py).

Release mode: the live venv is never edited. A release folder holds the overlay (a symlink farm
of the installed sglang with the patch set's files laid over it), the kernels, the rendered
drop-in and rollback.sh. Switching is one drop-in rename plus one symlink flip, both atomic.
In-place mode also backs up and replaces the live files (remote/release_files.py).
This module keeps the names callers and tests import.
"""

from __future__ import annotations

from fleetspec.ops.activation import (
                                      activate,
                                      deactivate,
                                      exec_start_mismatch,
                                      expected_algorithm,
                                      journal_tail,
                                      leave,
                                      loaded_exec_start_mismatch,
                                      restore_baseline_files,
                                      revert_to,
)
from fleetspec.ops.planning import Plan, plan
from fleetspec.ops.rendering import (
                                      _env,
                                      dropin_text,
                                      lint_unit,
                                      release_dropin_candidates,
                                      render_release,
                                      rollback_script,
)
from fleetspec.ops.smoke_run import _SMOKE_RUNNER, kernel_path, run_smoke_scripts, smoke
from fleetspec.ops.staging import SECRETS_FILE, env_file_text, stage
from fleetspec.remote.release_files import in_place_apply, in_place_undo

__all__ = ["SECRETS_FILE", "Plan", "_SMOKE_RUNNER", "_env", "activate",
           "deactivate", "dropin_text", "env_file_text", "exec_start_mismatch", "expected_algorithm", "in_place_apply",
           "in_place_undo", "journal_tail", "kernel_path", "leave", "lint_unit", "loaded_exec_start_mismatch", "plan",
           "release_dropin_candidates", "render_release", "restore_baseline_files", "revert_to",
           "rollback_script", "run_smoke_scripts", "smoke", "stage"]
