"""`fleetspec history`: the table at 80 columns and a release's story, from ledgers the deploy's
own step machinery wrote over real SSH (tests/unit/ledgers.py), read back by the real CLI in a
child process (the host read over SSH, and the local mirror when the host is gone)."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetspec.model import ledger as L
from fleetspec.model.inventory import load_inventory
from fleetspec.model.layout import local_mirror
from fleetspec.ops import history as H
from fleetspec.remote.transport import TransportPool
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


FIXTURE = REPO / "tests" / "fixtures" / "ledger"


@pytest.fixture(scope="module")
def story(tmp_path_factory, ssh_client_key):
    """A fleet root whose local mirror holds the four recorded releases, for a host that no
    longer answers (nothing listens on its port): history must tell its story from the mirror."""
    root = tmp_path_factory.mktemp("root")
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir()
    (root / "inventory" / "lab.yaml").write_text(
        "defaults: {user: root, ssh_key: %s, known_hosts: %s, connect_timeout: 1,\n"
        "           vars: {service: sglang-qwen.service}}\n"
        "hosts:\n  ct203: {address: 127.0.0.1, port: %d}\n" % (ssh_client_key, root / "known_hosts", free_port()))
    host = load_inventory(root / "inventory" / "lab.yaml").hosts["ct203"]
    mirror = local_mirror(root, host, host.vars.service)
    mirror.mkdir(parents=True)
    text = (FIXTURE / "story.jsonl").read_text()
    (mirror / "ledger.jsonl").write_text(text)
    return root, json.loads((FIXTURE / "story-ids.json").read_text()), text


def test_fixture_is_what_the_ledger_code_writes_today():
    """The recorded lines (python -m tests.unit.ledgers tests/fixtures/ledger) still parse whole
    and re-serialise byte for byte: the fixture has not drifted from model/ledger.py."""
    text = (FIXTURE / "story.jsonl").read_text()
    parsed = L.parse(text)
    assert not parsed.skipped and len(parsed.entries) == len(text.splitlines())
    assert L.render(parsed.entries) == text


def test_a_reachable_host_is_read_over_ssh(sshd, tmp_path, ssh_client_key, inventory_writer):
    inv = inventory_writer(tmp_path / "inv.yaml", {"a": sshd}, ssh_client_key,
                           host_vars={"a": "{service: fleetspec-opx-none-%d.service}" % os.getpid()})
    host = load_inventory(inv).hosts["a"]
    (tmp_path / ".fleetspec").mkdir()
    with TransportPool() as pool:
        got = H.read_ledger(pool.get(host), host, tmp_path)
    assert got.source == "host" and got.warning is None and got.parsed.entries == ()


def cli(root: Path, *args, columns: int = 80, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(COLUMNS=str(columns), LINES="50", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(root), *args], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=60)


def words_of(text: str) -> set[str]:
    return set(text.split())


def leaf_strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in leaf_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in leaf_strings(v)]
    if isinstance(value, bool) or value is None:
        return []
    return [f"{value:g}" if isinstance(value, float) else str(value)]


def assert_fits(out: str, width: int) -> None:
    for line in out.splitlines():
        # A line may pass the width only when it is one unbreakable word (after its indent/label).
        if len(line) > width:
            assert len(line.split()) <= 2, f"line of {len(line)} columns with spaces in it: {line!r}"


def test_table_at_80_columns_cuts_no_value(story):
    root, ids, _ = story
    r = cli(root, "history", "ct203")
    assert r.returncode == 0, r.stderr
    assert "showing the local mirror" in r.stderr           # the host is gone; its story is not
    out = r.stdout
    assert not ANSI.search(out)                              # not a TTY: no colour
    assert_fits(out, 80)
    words = words_of(out)
    for rid in ids.values():
        assert rid in words                                  # whole ids, never `2026…-ddt`
    assert {"healthy", "rolled_back", "failed"} <= words
    # Headline gate figures with units, each number whole.
    assert "accept 3.4 tok/step (baseline 3)" in " ".join(out.split())
    assert "c4 149.9 tok/s (x1.00 of baseline)" in " ".join(out.split())
    assert "c1 17.4 tok/s (x0.42 of baseline)" in " ".join(out.split())
    assert "failed at gates:" in out and "failed at probes:" in out and "failed at stage:" in out
    # The failing reasons, word for word.
    flat = " ".join(out.split())
    assert "cannot write /var/lib/fleetspec/objects/4b1d: No space left on device" in flat


def test_table_wide_is_one_line_per_release(story):
    root, ids, _ = story
    r = cli(root, "history", "ct203", columns=220)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["release", "algo", "status"]
    for rid in ids.values():
        row = [ln for ln in lines if rid in ln]
        assert len(row) == 1, row
    healthy = next(ln for ln in lines if ids["healthy"] in ln)
    assert healthy.split()[1:3] == ["ddtree", "healthy"] and "accept 3.4 tok/step" in healthy
    stage = next(ln for ln in lines if ids["stage"] in ln)
    assert stage.split()[1:3] == ["nextn", "failed"] and " stage " in stage


def test_story_of_a_failed_release_shows_step_and_evidence(story):
    root, ids, host_copy = story
    rid = ids["gates"]
    r = cli(root, "history", "ct203", rid[-11:])               # a unique suffix is enough
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert_fits(out, 80)
    flat = " ".join(out.split())
    assert f"release {rid} on ct203" in out
    assert "status rolled_back" in out
    assert ("failed at gates: acceptance fail: accept length 1.21 < floor 2.0; throughput fail: release/baseline "
            "tokens/s 0.399 < 0.95; parity fail: greedy output differs at token 3 for 'The capital of France is' "
            "(baseline 14, release 99)") in flat
    after = out.split("\nsteps\n", 1)[1]                        # the step details (the timeline is above)
    steps = [ln.split() for ln in after.splitlines() if ln.startswith("  ") and not ln.startswith("   ")]
    names = [w[0] for w in steps if len(w) >= 3 and w[1] in ("ok", "failed", "started", "skipped")]
    assert names == ["preflight", "baseline", "stage", "measure", "switch", "restart", "probes", "gates", "revert"]
    gates_line = next(w for w in steps if w[0] == "gates")
    assert gates_line[1] == "failed" and re.fullmatch(r"\d+\.\d+s", gates_line[2])
    assert "evidence:" in out
    # Every value this release recorded is printed whole (argv words, sha256, figures, reasons).
    entries = [e for e in L.parse(host_copy).entries if e.release == rid]
    words = words_of(out)
    for e in entries:
        for value in leaf_strings({k: v for k, v in e.detail.items() if k != "seconds"}):
            for word in value.split():
                assert word in words or any(word in w for w in words), (word, e.name)
    assert f"by {entries[0].by}" in flat                          # who deployed it


def test_story_of_a_crash_shows_the_journal(story):
    root, ids, _ = story
    r = cli(root, "history", "ct203", ids["probes"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert_fits(out, 80)
    flat = " ".join(out.split())
    assert "failed at probes: unit: sglang-qwen.service is activating/auto-restart (restarted 3 times)" in flat
    assert "journal:" in out
    assert "sglang-qwen.service: Failed with result 'exit-code'." in flat


def test_json_is_the_ledger_lines_unchanged(story):
    root, ids, host_copy = story
    r = cli(root, "history", "ct203", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stdout == host_copy
    r = cli(root, "history", "ct203", ids["healthy"], "--json")
    assert r.stdout.splitlines() == [ln for ln in host_copy.splitlines() if json.loads(ln)["release"] == ids["healthy"]]


def test_unknown_release_is_one_line(story):
    root, _, _ = story
    r = cli(root, "history", "ct203", "nope")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("fleetspec: ct203: no release 'nope' in the ledger")


def _on_a_tty(root: Path, env_extra: dict) -> str:
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
    env.update(TERM="xterm-256color", COLUMNS="100", **env_extra)
    p = subprocess.Popen([sys.executable, "-m", "fleetspec", "--root", str(root), "history", "ct203"], cwd=REPO,
                         stdout=slave, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=60)
    os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_colour_only_on_a_tty_and_never_with_no_color(story):
    root, _, _ = story
    coloured = _on_a_tty(root, {})
    assert ANSI.search(coloured), coloured[:300]
    plain = _on_a_tty(root, {"NO_COLOR": "1"})
    assert "rolled_back" in plain and not ANSI.search(plain)


def test_releases_fold_the_ledger(story):
    _, ids, host_copy = story
    rels = {r.id: r for r in H.releases(L.parse(host_copy))}
    assert [r.status for r in rels.values()] == ["healthy", "rolled_back", "rolled_back", "failed"]
    assert rels[ids["healthy"]].failed_step is None and rels[ids["healthy"]].figures["acceptance"]["accept_length"] == 3.4
    assert rels[ids["gates"]].failed_step == "gates" and rels[ids["gates"]].evidence["figures"]["throughput"]
    assert rels[ids["stage"]].algo == "nextn"
    assert H.headline({"parity": {"prompts_compared": 4}}) == ["parity 4 prompts identical"]


def test_an_operator_rollback_shows_as_a_later_event(story):
    """`fleetspec rollback` writes its lines under the release it left (ops/rollback.py)."""
    _, ids, text = story
    rid = ids["healthy"]
    text += L.render([L.Entry.step(rid, "rollback", "started", to="baseline", interrupted=[]),
                      L.Entry.step(rid, "rollback", "ok", to="baseline", waited_s=12.5)])
    rel = next(r for r in H.releases(L.parse(text)) if r.id == rid)
    assert rel.status == "healthy" and rel.events == ["rollback to baseline"] and rel.failed_step is None


def _root_with_mirror(tmp_path: Path, host: str, text: str, service: str = "sglang-qwen.service") -> Path:
    root = tmp_path / "root"
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir(parents=True)
    (root / "inventory" / "lab.yaml").write_text(
        f"defaults: {{known_hosts: {root / 'kh'}, connect_timeout: 1, vars: {{service: {service}}}}}\n"
        f"hosts:\n  {host}: {{address: 127.0.0.1, port: {free_port()}}}\n")
    mirror = local_mirror(root, load_inventory(root / "inventory" / "lab.yaml").hosts[host], service)
    mirror.mkdir(parents=True)
    (mirror / "ledger.jsonl").write_text(text)
    return root


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURE.glob("lab-*.jsonl")))
def test_ledgers_captured_from_lab_deploys_at_80_columns(tmp_path, fixture):
    """Ledgers a lab deploy wrote (mirrors copied from real runs on ct133/ct203): the table and
    every release's story fit 80 columns and print every recorded value whole."""
    text = (FIXTURE / fixture).read_text()
    host = fixture.removeprefix("lab-").removesuffix(".jsonl").split("-")[0]
    root = _root_with_mirror(tmp_path, host, text)
    parsed = L.parse(text)
    assert not parsed.skipped
    table = cli(root, "history", host)
    assert table.returncode == 0, table.stderr
    assert_fits(table.stdout, 80)
    for rel in H.releases(parsed):
        assert rel.id in words_of(table.stdout) and rel.status in words_of(table.stdout)
        story = cli(root, "history", host, rel.id)
        assert story.returncode == 0, story.stderr
        assert_fits(story.stdout, 80)
        words = words_of(story.stdout)
        for e in parsed.entries:
            if e.release != rel.id:
                continue
            for value in leaf_strings({k: v for k, v in e.detail.items() if k != "seconds"}):
                for word in value.split():
                    assert word in words or any(word in w for w in words), (word, e.name)
        for name in {e.name for e in parsed.entries if e.release == rel.id and e.kind == "step"}:
            assert name in words
