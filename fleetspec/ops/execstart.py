"""The operator's ExecStart as the process gets it: `$VARIABLES` expanded from Environment= and the
host's EnvironmentFile= exactly as systemd does (facts.execenv, facts.env_files), and what that
expansion means for a deploy.

fleetspec's drop-in writes the *expanded* argv (every `$` as `$$`), not the variables: the
derived command is then exact whatever fleetspec's own drop-in adds to or removes from the
environment (PYTHONPATH, UnsetEnvironment= of speculation-only variables), and `systemctl show`
after the reload can be compared with it word for word. Rollback restores the unit's recorded
bytes, variables and all; fleetspec never edits an EnvironmentFile=. A variable whose value is
secret is refused: the drop-in and `systemctl show` would expose it.
"""

from __future__ import annotations

from fleetspec import systemd_unit, unit_context
from fleetspec.errors import UserError
from fleetspec.model.baseline import is_secret
from fleetspec.model.inventory import Host
from fleetspec.model.playbook import Playbook
from fleetspec.ops.redaction import argv_secrets, secret_refs
from fleetspec.remote import facts
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts import env_files as env_files_fact
from fleetspec.remote.facts import execenv


def host_environment(t: TransportLike, unit_bytes: bytes, dropin_texts: list[str], service: str,
                     manager: execenv.HostEnv | None = None) -> execenv.HostEnv:
    """What the unit's process takes its environment from on the host: each EnvironmentFile='s
    bytes and the manager's environment. `manager`: the manager's environment already read (preflight's
    batch); then a unit without EnvironmentFile= costs no round trip, one with it costs one."""
    specifiers = unit_context.unit_specifiers(service)
    patterns = tuple(execenv.env_file_patterns([unit_bytes.decode(errors="replace"), *dropin_texts], specifiers))
    if not patterns and manager is not None:
        return manager
    return facts.gather(t, env_files_fact, patterns=patterns)


def exec_command(t: TransportLike, unit_bytes: bytes, dropin_texts: list[str], service: str,
                 env: execenv.HostEnv | None = None) -> systemd_unit.ExecCommand:
    """The effective ExecStart command of `service`, its name specifiers resolved (a Quadlet unit's
    `%N`, `%t`); reads the host's environment files only when the command uses variables and `env`
    (host_environment) is not given (one more round trip for such units, none for the others)."""
    text = unit_bytes.decode(errors="replace")
    specifiers = unit_context.unit_specifiers(service)
    try:
        return execenv.effective_exec_command(text, dropin_texts, specifiers)
    except systemd_unit.NeedsHostEnvironment:
        pass
    if env is None:
        env = host_environment(t, unit_bytes, dropin_texts, service)
    return execenv.effective_exec_command(text, dropin_texts, specifiers, env=env)


def engine_environment(unit_bytes: bytes, dropin_texts: list[str], service: str, env: execenv.HostEnv,
                       where: str) -> dict[str, str]:
    """The engine's environment as systemd builds it (Environment=, EnvironmentFile=, the manager's
    environment, less UnsetEnvironment=): what the plan, the drop-in's UnsetEnvironment= and the
    gates' simulated-acceptance check read. A required EnvironmentFile= systemd could not load is
    refused in one line: fleetspec would not know what the engine starts with."""
    texts = [unit_bytes.decode(errors="replace"), *dropin_texts]
    try:
        return execenv.service_environment(texts, env, unit_context.unit_specifiers(service))
    except systemd_unit.UnitSyntaxError as err:
        raise UserError(f"{where}: {err}") from None


def check_variables(command: systemd_unit.ExecCommand, host: Host, playbook: Playbook | None, where: str) -> list[str]:
    """Refuse a secret that expansion would write into the drop-in; otherwise the plan's note
    (names and where each value came from, never the values)."""
    names, values = secret_refs(host, playbook)
    # a secret option's value (`--api-key sk-…`) that a variable brought into the command line:
    # `SGLANG_ARGS=--api-key sk-…` in a 0600 EnvironmentFile= would land in the 0644 drop-in
    carried = [v for v in argv_secrets(command.argv) if any(src.value and v in src.value for _, src in command.variables)]
    for name, src in command.variables:
        if src.value and (is_secret(name, src.value, names, values) or any(v in src.value for v in carried)):
            raise UserError(f"{where}: ExecStart= takes ${name} from {src.source}, which holds a secret; fleetspec "
                            f"writes the expanded command line into its drop-in, where `systemctl show` prints it; "
                            f"take the secret out of the command line (or write the unit without the variable)")
    if not command.variables:
        return []
    used = ", ".join(f"${name} ({src.source if src.value is not None else 'unset: ' + src.source})"
                     for name, src in command.variables)
    return [f"ExecStart's variables expanded as systemd does: {used}; fleetspec's drop-in writes the expanded "
            f"command line, and rollback restores the unit with its variables"]
