"""The exit codes (errors.EXIT_CODES): one table, shown by `--help` and written once in the manual;
a prompt answered no exits 5 and names the inventory; NO_COLOR and --no-color leave no styles."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetspec.cli import main
from fleetspec.errors import EXIT_CODES

REPO = Path(__file__).resolve().parents[2]
TABLE_PAGE = REPO / "docs" / "guide" / "fleets.md"


def test_the_manuals_table_is_the_codes_table():
    text = TABLE_PAGE.read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d) \| (.+?) \|$", section, re.M)
    assert {int(code): meaning for code, meaning in rows} == EXIT_CODES, rows


def test_help_shows_the_table():
    out = CliRunner().invoke(main, ["--help"]).output
    for code, meaning in EXIT_CODES.items():
        assert re.search(rf"^\s+{code}\s+{re.escape(meaning)}$", out, re.M), out


def test_other_pages_point_at_the_table_not_a_copy():
    """One table: the README and the manual's front page link to it rather than list the codes."""
    for page in (REPO / "README.md", REPO / "docs" / "index.md"):
        text = page.read_text()
        assert "rolled back; **2** bad input" not in text and "Exit codes: 0 ok; 1" not in text, page
        assert "exit-codes" in text, page


@pytest.fixture
def root(tmp_path):
    (tmp_path / "inventory").mkdir()
    for sub in ("playbooks", "templates"):
        (tmp_path / sub).symlink_to(REPO / sub)
    (tmp_path / "inventory" / "lab.yaml").write_text(
        "defaults: {known_hosts: /dev/null, connect_timeout: 1}\nhosts:\n  a: {address: 127.0.0.1, port: 9}\n")
    return tmp_path


def test_a_declined_prompt_exits_5_and_the_prompt_names_the_inventory(root):
    """On a terminal (a real pty) `deploy` asks first; the question names the inventory file and
    'n' changes nothing and exits 5 (click's own Abort was 1, the code of a reverted change)."""
    leader, follower = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    proc = subprocess.Popen([sys.executable, "-m", "fleetspec", "--root", str(root), "deploy", "a", "--algo", "nextn"],
                            stdin=follower, stdout=follower, stderr=follower, env=env, cwd=root)
    os.close(follower)
    seen = b""
    while b"[y/N]" not in seen:
        chunk = os.read(leader, 4096)
        assert chunk, seen
        seen += chunk
    os.write(leader, b"n\n")
    try:
        while chunk := os.read(leader, 4096):
            seen += chunk
    except OSError:                                      # EIO: the child closed its side
        pass
    assert proc.wait(timeout=60) == 5, seen
    text = seen.decode()
    assert f"Deploy nextn to a (inventory {root / 'inventory' / 'lab.yaml'})?" in text, text
    assert "fleetspec: aborted" in text and "cannot reach" not in text, text


@pytest.mark.parametrize("how", [{"env": {"NO_COLOR": "1"}}, {"flag": "--no-color"}])
def test_no_color_leaves_no_bold_or_dim(root, how):
    """rich drops only colours under NO_COLOR; bold and dim stayed. FORCE_COLOR makes rich style
    as on a terminal, so the styles would show here."""
    env = {"FORCE_COLOR": "1", "COLUMNS": "120", **how.get("env", {})}
    args = ["--root", str(root), *([how["flag"]] if "flag" in how else []), "status"]
    r = CliRunner().invoke(main, args, env=env)
    assert r.exit_code == 4 and "unreachable" in r.output and "\x1b[" not in r.output, repr(r.output)
    styled = CliRunner().invoke(main, ["--root", str(root), "status"], env={"FORCE_COLOR": "1", "COLUMNS": "120"})
    assert "\x1b[" in styled.output                                          # styles are on otherwise


def test_the_plan_names_the_inventory(root):
    """`--plan` says which inventory it read, in text and in JSON (the host is unreachable: exit 4)."""
    path = root / "inventory" / "lab.yaml"
    r = CliRunner().invoke(main, ["--root", str(root), "deploy", "a", "--algo", "nextn", "--plan"])
    assert r.exit_code == 4 and f"inventory: {path}" in r.output, r.output
    r = CliRunner().invoke(main, ["--root", str(root), "deploy", "a", "--algo", "nextn", "--plan", "--json"])
    assert f'"inventory": "{path}"' in r.output, r.output
