"""Unchecked names (issue 13 item 4), with hostile values from hypothesis: shell metacharacters,
`..`, `$(…)`, backquotes, newlines, a leading '-', systemd's `\\x2d`.

One strict pattern (fleetspec.model.names) is checked where each name is loaded: release ids read
back from a host's ledger or manifest, playbook algos (release ids carry them), patch-set packages
and extra top-level names, service and host names. Generated shell quotes every expansion anyway:
rollback.sh is rendered with hostile values and run for real. An HTTP header never carries CR/LF.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fleetspec.build.patchset import load_patchset
from fleetspec.errors import ConfigError, RemoteError, UserError
from fleetspec.model import ledger as L
from fleetspec.model.inventory import load_inventory
from fleetspec.model.names import is_name, is_service
from fleetspec.model.playbook import load_playbook, load_playbook_for
from fleetspec.model.release import Release
from fleetspec.ops import planning, rendering
from fleetspec.ops.hoststate import HostState
from fleetspec.remote import ledger_files
from fleetspec.remote.transport import Transport

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "sglang-test.service"
HOSTILE = ["..", ".", "../../etc", "../../../../etc/cron.d", "$(touch PWNED)", "`touch PWNED`", "a;touch PWNED",
           "-rf", "--help", "-sglang", "a\nb", "a\n", "x\\x2dy", "a b", "it's", 'a"b', "", "a/b", "a..b", "é",
           "a\rb", "a\x00b", "${IFS}", "*", "a|b", "a&b", "a>b", "~root"]
hostile = st.one_of(st.sampled_from(HOSTILE),
                    st.builds(lambda a, b, c: a + b + c, st.text(max_size=8), st.sampled_from(HOSTILE), st.text(max_size=8)),
                    st.text(max_size=30))
no_nul = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=30)
PROP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _plain(value: str) -> bool:
    return (shlex.quote(value) == value and "/" not in value and value not in (".", "..") and ".." not in value
            and not value.startswith("-") and value.isascii() and value.isprintable() and "\\" not in value)


@PROP
@given(hostile)
def test_an_accepted_name_is_one_plain_path_part_and_shell_word(value):
    if is_name(value):
        assert _plain(value) and len(value) <= 128
    if is_service(value):
        assert _plain(value.replace("@", "_").replace(":", "_")) and value.endswith(".service")


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_names_are_refused(value):
    assert not is_name(value) and not is_service(value + ".service" if value else value)


def test_real_names_are_accepted():
    assert is_name("20261201T044500Z-ddtree-ab12") and is_name("sglang") and is_name("baseline")
    assert is_service("sglang-qwen.service") and is_service("sglang@qwen.service")


# Release ids read back from the host -------------------------------------------------------------
@PROP
@given(hostile)
def test_the_ledger_keeps_only_entries_whose_release_is_a_name(release):
    line = json.dumps({"kind": "status", "release": release, "name": "release", "state": "healthy", "ts": 1,
                       "by": "x", "detail": {}})
    parsed = L.parse(line + "\n")
    assert [e.release for e in parsed.entries] == ([release] if is_name(release) else [])
    assert parsed.skipped == (() if is_name(release) else (1,))


def test_prune_never_follows_a_release_id_out_of_releases(t, tmp_path):
    """A ledger that names `../../victim` healthy: prune (keep 1) removes old releases, never it."""
    root = tmp_path / "state"
    base = root / "sglang-test"
    victim = root / "victim"
    victim.mkdir(parents=True)
    (victim / "keep").write_text("x")
    ids = ["20260101T000000Z-ddtree-0001", "../../victim", "20260102T000000Z-ddtree-0002"]
    for rid in ids:
        if is_name(rid):
            (base / "releases" / rid).mkdir(parents=True)
    (base / "ledger.jsonl").write_text("".join(L.Entry.status(r, L.HEALTHY).to_line() + "\n" for r in ids))
    state = HostState(t, "h", SERVICE, root=root)
    ledger = (base / "ledger.jsonl").read_text()
    old = planning.to_prune(state, ledger, ids[2], keep=1)              # a deploy's prune: no read
    assert old == [ids[0]]
    script, lines = planning.prune_script(state, old)
    assert ledger_files.pruned_by(t.run_script(script).stdout, lines) == [ids[0]]
    assert (victim / "keep").read_text() == "x" and (base / "releases" / ids[2]).is_dir()


@PROP
@given(field=st.sampled_from(["id", "previous", "file", "kernel"]), value=hostile)
def test_a_manifest_accepts_only_names_and_plain_relative_paths(field, value):
    raw = dict(id="r1", host="h", service=SERVICE, algo="ddtree", mode="in-place", sglang_version="x",
               argv=["/bin/true"], previous="baseline")
    if field in ("id", "previous", "kernel"):
        raw.update({field: value} if field != "kernel" else {"kernels": {value: "0" * 64}})
        safe = is_name(value)
    else:
        raw["files"] = {value: "0" * 64}
        parts = value.split("/")
        safe = bool(value) and not any(p in ("", ".", "..") or p.startswith("-") for p in parts) and \
            "\\" not in value and not any(ord(c) < 32 or ord(c) == 127 for c in value)
    if safe:
        assert Release.from_json(json.dumps(raw)).id == raw["id"]
    else:
        with pytest.raises(ValueError):
            Release.from_json(json.dumps(raw))


def test_a_hostile_current_link_or_manifest_is_refused_on_the_host(t, tmp_path):
    root = tmp_path / "state"
    base = root / "sglang-test"
    (base / "releases" / "r1").mkdir(parents=True)
    state = HostState(t, "h", SERVICE, root=root)
    os.symlink(str(base / "releases" / ".."), base / "current")
    with pytest.raises(RemoteError, match="not at a release folder"):
        state.current()
    os.remove(base / "current")
    os.symlink(str(base / "releases" / "r1"), base / "current")
    assert state.current() == "r1"
    (base / "releases" / "r1" / "manifest.json").write_text(json.dumps(dict(
        id="r1", host="h", service=SERVICE, algo="ddtree", mode="release", sglang_version="x", argv=["/bin/true"],
        previous="../../../../etc")))
    with pytest.raises(RemoteError, match="not a valid release manifest"):
        state.read_release("r1")
    with pytest.raises(RemoteError, match="not a release id"):
        state.release_exists("../r1")


# Names loaded from the fleet root ----------------------------------------------------------------
def _patchset(folder: Path, package, extra) -> Path:
    data = b"x = 1\n"
    (folder / "files" / "plug").mkdir(parents=True)
    (folder / "files" / "plug" / "x.py").write_bytes(data)
    (folder / "manifest.json").write_text(json.dumps({
        "package": package, "version": "1.0", "extra_top_level": extra,
        "files": [{"path": "plug/x.py", "action": "add", "sha256": hashlib.sha256(data).hexdigest()}]}))
    return folder


@PROP
@given(hostile)
def test_a_patch_set_package_must_be_a_plain_top_level_name(tmp_path_factory, package):
    assume(package != "plug")
    folder = _patchset(tmp_path_factory.mktemp("ps"), package, ["plug"])
    try:
        ps = load_patchset(folder)
    except ConfigError as err:
        assert "package" in str(err) and not (is_name(package) and package.isidentifier())
    else:
        assert ps.package == package and is_name(package) and package.isidentifier()


@pytest.mark.parametrize("extra", ["plug\n", "../plug", "plug/x", "-plug", "plug-1..0.dist-info"])
def test_an_extra_top_level_name_with_a_newline_or_path_is_refused(tmp_path, extra):
    with pytest.raises(ConfigError, match="extra_top_level"):
        load_patchset(_patchset(tmp_path, "sglang", [extra]))


@PROP
@given(hostile)
def test_a_service_name_is_checked_at_load(tmp_path_factory, service):
    path = tmp_path_factory.mktemp("inv") / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"h": {"address": "h.example", "vars": {"service": service}}}}))
    try:
        inv = load_inventory(path)
    except ConfigError as err:
        assert "service" in str(err) and not is_service(service)
    else:
        got = inv.hosts["h"].vars.service
        assert is_service(got) and not got.startswith("-") and "\\" not in got


@pytest.mark.parametrize("service", ["-sglang.service", "sglang\\x2dqwen.service", "sglang.service\n",
                                     "a b.service", "$(id).service", "../x.service", ".x.service"])
def test_hostile_service_names_are_refused(tmp_path, service):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"h": {"address": "h.example", "vars": {"service": service}}}}))
    with pytest.raises(ConfigError, match="service"):
        load_inventory(path)


def test_a_host_name_with_a_trailing_newline_is_refused(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"ct129\n": {"address": "h.example"}}}))
    with pytest.raises(ConfigError):
        load_inventory(path)


@pytest.mark.parametrize("algo", ["a$(id)", "-x", "a b", "a..b", "x\n"])
def test_an_algo_must_be_a_name(tmp_path, algo):
    (tmp_path / "playbooks").mkdir()
    with pytest.raises(UserError):
        load_playbook_for(tmp_path, algo)
    path = tmp_path / "playbooks" / f"{algo}.yaml"
    path.write_text(yaml.safe_dump({"algo": algo, "speculative_algorithm": "X"}))
    with pytest.raises(ConfigError, match="algo"):
        load_playbook(path)


# Generated shell and headers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def fakebin(tmp_path_factory):
    """A systemctl that records its argv (the thing under test is rollback.sh's quoting)."""
    d = tmp_path_factory.mktemp("bin")
    (d / "systemctl").write_text('#!/bin/sh\n{ printf "%s\\0" "$#"; for a in "$@"; do printf "%s\\0" "$a"; done; } '
                                 '>> "$SYSTEMCTL_LOG"\n')
    (d / "systemctl").chmod(0o755)
    return d


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(service=no_nul, rid=no_nul, previous=no_nul, reason=no_nul)
def test_rollback_sh_runs_nothing_from_names_labels_or_reason(tmp_path_factory, fakebin, service, rid, previous,
                                                              reason):
    work = tmp_path_factory.mktemp("rb")
    state, etc = work / "state", work / "etc"
    state.mkdir(), etc.mkdir()
    unit = etc / "sglang.service"
    unit.write_bytes(b"[Service]\nExecStart=/bin/true\n")
    release = Release(id=rid, host="h", service=service, algo="ddtree", mode="release", sglang_version="x",
                      argv=["/bin/true"], previous=previous)
    text = rendering._env(ROOT).get_template("rollback.sh.j2").render(
        service=service, release=release, previous_label=previous, state_dir=str(state),
        dropin_path=str(etc / "zz-fleetspec.conf"), previous_dropin=[], previous_dropin_sha256="",
        legacy_dropin_paths=[str(etc / "50-fleetspec.conf")],
        previous_current="", restore_files=[], remove_files=[],
        unit_sha256=hashlib.sha256(unit.read_bytes()).hexdigest(), unit_path=str(unit), sources=[])
    (work / "rollback.sh").write_text(text)
    log = work / "systemctl.log"
    r = subprocess.run(["sh", str(work / "rollback.sh"), "--reason", reason], cwd=work, capture_output=True,
                       env={"PATH": f"{fakebin}:/usr/bin:/bin", "SYSTEMCTL_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in work.iterdir()) == ["etc", "rollback.sh", "state", "systemctl.log"]
    assert r.stdout.decode() == f"fleetspec: {service} is back on {previous}; check it with: systemctl status {service}\n"
    words, calls = log.read_bytes().split(b"\0")[:-1], []
    while words:
        n = int(words[0])
        calls.append(words[1:1 + n])
        words = words[1 + n:]
    assert calls[-1] == [b"restart", b"--", service.encode()]
    flat = lambda s: "".join(" " if ord(c) < 32 else c for c in s)  # control chars become spaces
    lines = [json.loads(x) for x in (state / "ledger.jsonl").read_text().split("\n") if x]
    assert [(x["name"], x["release"], x["detail"]["reason"]) for x in lines] == \
        [("rollback.sh", flat(rid), flat(reason or "operator")), ("release", flat(rid), flat(reason or "operator"))]


@PROP
@given(st.text(max_size=10), st.sampled_from(["\r", "\n", "\r\n", "\x00"]), st.text(max_size=10))
def test_an_api_key_with_cr_or_lf_never_reaches_a_header(a, bad, b):
    host = SimpleNamespace(name="h", host_key_policy="strict")
    with pytest.raises(UserError, match="CR, LF or NUL"):
        Transport(host).http("GET", 30000, "/generate", headers={"Authorization": f"Bearer {a}{bad}{b}"})


@PROP
@given(st.one_of(hostile, st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,20}\.service", fullmatch=True)))
def test_the_guard_instance_of_an_accepted_service_is_its_state_folder(service):
    """The guard runs `<state root>/%i/current/rollback.sh`; systemd puts the raw instance in %i
    (and undoes `\\xNN` escapes and maps '-' to '/' only in %I). An accepted name has no `\\` and no
    `%`, so the instance the drop-in names is the state folder, character for character."""
    from fleetspec.model.layout import HostLayout

    assume(is_service(service))
    guard = (ROOT / "templates" / "fleetspec-guard@.service.j2").read_text()
    assert "/%i/current/rollback.sh" in guard and "%I" not in guard
    instance = service.removesuffix(".service")
    assert "\\" not in instance and "%" not in instance and "/" not in instance
    assert HostLayout(service).base.name == instance
