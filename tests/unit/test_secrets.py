"""One list of secret words and one placeholder (fleetspec/secrets.py), read by `-v` (remote/observe),
the baseline (model/baseline) and the plan and ledger (ops/redaction) alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetspec import secrets
from fleetspec.model import ansible_host, baseline
from fleetspec.ops import redaction
from fleetspec.remote import observe

PKG = Path(__file__).resolve().parents[2] / "fleetspec"


@pytest.mark.parametrize("part", secrets.NAME_PARTS)
def test_verbose_and_the_baseline_hide_the_same_names(part):
    """A variable the baseline records as secret is hidden by -v too (it read its own, shorter list:
    CREDENTIAL, COOKIE, AUTH, PRIVATE… went through -v in clear)."""
    name = f"MY_{part}_X"
    assert baseline.is_secret(name, "v-123")
    assert observe.redact(f"env {name}=v-123 run") == f"env {name}={secrets.PLACEHOLDER} run"


def test_one_placeholder_everywhere():
    host_like = type("H", (), {"vars": type("V", (), {"api_key": None})()})()
    playbook_like = type("P", (), {"launch": type("L", (), {"secret_env": ()})()})()
    said = redaction.redact("sglang --api-key sk-9 --port 1", host_like, playbook_like, ["--api-key", "sk-9"])
    assert said == f"sglang --api-key {secrets.PLACEHOLDER} --port 1"
    assert observe.redact("--api-key sk-9") == f"--api-key {secrets.PLACEHOLDER}"
    assert baseline.recorded_environment(b"[Service]\nEnvironment=HF_TOKEN=t\n", {}) == {
        "HF_TOKEN": secrets.PLACEHOLDER}
    assert ansible_host.SECRET_KEYS is secrets.ANSIBLE_KEYS


def test_no_other_module_holds_a_secret_word_list():
    """The words and the placeholders live in fleetspec/secrets.py only."""
    words = re.compile(r"""["'](PASSWD|CREDENTIAL|COOKIE)["']|passwd\||\*\*\*|"<redacted>"|ansible_ssh_pass""")
    found = [f"{p.relative_to(PKG)}:{n}" for p in PKG.rglob("*.py") if p.name != "secrets.py"
             and p.relative_to(PKG).parts[0] != "lab"       # the lab's stand-ins mimic other programs
             for n, line in enumerate(p.read_text().splitlines(), 1) if words.search(line)]
    assert found == []
