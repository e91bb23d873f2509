"""Errors that map to fleetspec's exit codes, and the one table of those codes.

EXIT_CODES is the table every command follows; `fleetspec --help` prints it and
tests/unit/test_exit_codes.py checks the manual's copy against it.
The CLI prints `str(err)` as one line; nothing user-caused ever shows a traceback.
"""

from __future__ import annotations

OK, REVERTED, BAD_INPUT, NEEDS_ATTENTION, UNREACHABLE, DECLINED = 0, 1, 2, 3, 4, 5

EXIT_CODES: dict[int, str] = {
    OK: "ok",
    REVERTED: "a change failed and was reverted",
    BAD_INPUT: "bad input, nothing changed",
    NEEDS_ATTENTION: "a host needs attention",
    UNREACHABLE: "a host unreachable or timed out",
    DECLINED: "declined at the prompt or aborted by the user",
}


def exit_code_lines() -> list[str]:
    """The table as `--help` shows it: one `CODE  meaning` line per code."""
    return [f"{code}  {meaning}" for code, meaning in EXIT_CODES.items()]


class FleetspecError(Exception):
    exit_code = 1
    command: str | None = None          # what the operator runs next (NeedsAttention, StepFailed)
    charged_step: str | None = None     # the deploy step a failed ledger write is charged to (hoststate)


class UserError(FleetspecError):
    """Bad input: a file, key, host or flag that is not what was expected. Nothing was changed."""

    exit_code = BAD_INPUT


class ConfigError(UserError):
    """A fleet-root file failed validation; the message names the file and key path."""

    def __init__(self, path, key: str | None, expected: str):
        self.path, self.key, self.expected = str(path), key, expected
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {expected}")


class DeployFailed(FleetspecError):
    """A deploy failed and the host was put back on its previous good state."""

    exit_code = REVERTED


class NeedsAttention(FleetspecError):
    """A host was left in a state that an operator must finish; the message says what to run."""

    exit_code = NEEDS_ATTENTION

    def __init__(self, message: str, command: str | None = None):
        self.command = command
        super().__init__(message + (f" — run: {command}" if command else ""))


class RemoteError(FleetspecError):
    """A remote command or transfer failed (refused key, non-zero exit, lost connection)."""

    exit_code = 1


class Unreachable(RemoteError):
    """The host could not be reached within its connect timeout (no route, no answer, no name), or a
    command on it ran past its command timeout."""

    exit_code = UNREACHABLE
