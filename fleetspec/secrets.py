"""What fleetspec treats as secret, and the one placeholder that stands for a hidden value (pure).

One list of the words that make a name secret, one list of sglang's secret options and one
placeholder, so that `-v`'s commands (remote/observe.py), a baseline's environment
(model/baseline.py) and the plan, the ledger and the drop-in checks (ops/redaction.py,
ops/execstart.py) hide the same things the same way. It imports nothing of fleetspec: every layer
reads it.
"""

from __future__ import annotations

import re

PLACEHOLDER = "<redacted>"

# a variable, option or key whose name holds one of these (any case) has a secret value
NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "PRIVATE")

# sglang's options whose value is a secret (both versions' parsers; tests/unit/test_security_audit.py
# checks the option tables). argparse takes a unique prefix too; `--ssl-keyfile` is its own option.
SECRET_OPTIONS = ("--admin-api-key", "--api-key", "--ssl-keyfile-password")
NOT_SECRET_OPTIONS = ("--ssl-keyfile",)

# an Ansible inventory's connection secrets, which fleetspec never reads (it uses keys and sudo -n)
ANSIBLE_KEYS = ("ansible_password", "ansible_ssh_pass", "ansible_become_password", "ansible_become_pass",
                "ansible_ssh_private_key_passphrase")


def is_secret_name(name: str) -> bool:
    """A name that marks its value secret (SGLANG_API_KEY, HF_TOKEN, --admin-api-key …)."""
    upper = name.upper()
    return any(part in upper for part in NAME_PARTS)


# `NAME=value`, `--name value`, `name: value`, `"name": "value"` where NAME holds a NAME_PARTS word
# (a value already hidden is left as it is)
NAMED_VALUE = re.compile(
    r"(?i)((?:--)?[A-Za-z0-9_-]*(?:" + "|".join(p.lower() for p in NAME_PARTS) + r")[A-Za-z0-9_]*[\"']?"
    r"(?:=|\s+|:\s*))(?!" + re.escape(PLACEHOLDER) + r")(?:'[^']*'|\"[^\"]*\"|\S+)")
AUTHORIZATION = re.compile(r"(?i)(authorization:\s*)(?:bearer\s+|basic\s+)?[^\s'\"]+")


def redact_named(text: str) -> str:
    """Values written after secret-looking names (--api-key X, SGLANG_API_KEY=X, Authorization: …)
    replaced by PLACEHOLDER: for text whose secrets fleetspec does not hold (a command shown by -v)."""
    text = AUTHORIZATION.sub(lambda m: m.group(1) + PLACEHOLDER, text)
    return NAMED_VALUE.sub(lambda m: m.group(1) + PLACEHOLDER, text)
