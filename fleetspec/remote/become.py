"""Acting as root on a host through `sudo -n` (inventory `become: sudo`): the command's wrapping,
and what a failed `sudo -n true` means, said as the operator's fix."""

from __future__ import annotations

import shlex

# Root's umask over sshd, so that what sudo writes is moded as what root writes (sudo would
# otherwise apply the user's umask, e.g. 027, to every folder and file fleetspec makes).
SUDO_UMASK = "022"
SUDO_PROBE = "sudo -n -- true"
_SUDO_FIX = "fleetspec runs `sudo -n` and never types a password"


def become_sudo(command: str) -> str:
    """A shell command run as root through `sudo -n` (fails, never prompts, when a password is needed)."""
    return f"sudo -n -- sh -c {shlex.quote(f'umask {SUDO_UMASK}; {command}')}"


def sudo_problem(rc: int, output: str, user: str) -> str | None:
    """What `sudo -n true` answered, as the operator's fix; None when it worked."""
    if rc == 0:
        return None
    text = " ".join(output.split())
    said = f" (sudo said: {text[:160]})" if text else ""
    if rc == 127 or "not found" in text:
        return "sudo is not installed on the host; install it or connect as root"
    if "password is required" in text:
        # sudo answers the same for a user with no rule at all: it asks before it looks at the rules
        return (f"sudo asks for a password{said}: the user has no NOPASSWD rule (or no sudo rule at all) and "
                f"{_SUDO_FIX}; give it a NOPASSWD sudoers rule "
                f"(e.g. `{user} ALL=(root) NOPASSWD: ALL` in /etc/sudoers.d/) or connect as root")
    if "tty" in text:
        return f"its sudo needs a terminal (requiretty){said}; allow it without one or connect as root"
    return (f"the user may not use sudo{said}; give it a NOPASSWD sudoers rule "
            f"(e.g. `{user} ALL=(root) NOPASSWD: ALL` in /etc/sudoers.d/) or connect as root")
