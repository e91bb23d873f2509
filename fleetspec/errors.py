"""Errors that map to fleetspec's exit codes.

0 ok, 1 deploy failed and was rolled back, 2 bad input, 3 host left needing attention.
The CLI prints `str(err)` as one line; nothing user-caused ever shows a traceback.
"""

from __future__ import annotations


class FleetspecError(Exception):
    exit_code = 1
    command: str | None = None          # what the operator runs next (NeedsAttention, StepFailed)
    charged_step: str | None = None     # the deploy step a failed ledger write is charged to (hoststate)


class UserError(FleetspecError):
    """Bad input: a file, key, host or flag that is not what was expected. Nothing was changed."""

    exit_code = 2


class ConfigError(UserError):
    """A fleet-root file failed validation; the message names the file and key path."""

    def __init__(self, path, key: str | None, expected: str):
        self.path, self.key, self.expected = str(path), key, expected
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {expected}")


class DeployFailed(FleetspecError):
    """A deploy failed and the host was put back on its previous good state."""

    exit_code = 1


class NeedsAttention(FleetspecError):
    """A host was left in a state that an operator must finish; the message says what to run."""

    exit_code = 3

    def __init__(self, message: str, command: str | None = None):
        self.command = command
        super().__init__(message + (f" — run: {command}" if command else ""))


class RemoteError(FleetspecError):
    """A remote command or transfer failed (unreachable host, refused key, non-zero exit)."""

    exit_code = 1
