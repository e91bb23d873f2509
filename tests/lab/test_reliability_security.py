"""Security: nobody gets in, nothing leaks, nothing is left writable.

- A lab host whose key changed is refused (even with --accept-new-host-key); an unknown key is
  refused by default and recorded only when asked; known_hosts is never rewritten behind our back.
- One deploy with a playbook whose flags hold spaces, quotes, `%`, `$`, backquotes, `$(…)` and a
  newline: they reach the running server's launch_command byte for byte and execute nothing; a
  secret (launch.secret_env) reaches the service's environment through a 0600 file and appears in
  no output, no log, no ledger, no drop-in; the inventory's api_key neither.
- Files fleetspec writes on the host have sane owners and modes (root, nothing group/world-writable,
  the secrets file 0600 in a 0700 folder, the state and baseline folders 0700).
"""

from __future__ import annotations

import json
import secrets
import subprocess

import pytest

from tests.lab import reliability_lab as R

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="session")
def rel(lab_fleet, tmp_path_factory):
    return R.rel_fixture(lab_fleet, tmp_path_factory)


def _names(line: str, address: str) -> bool:
    return address in (line.split()[:1] or [""])[0].split(",")


def _known_hosts_root(rel, tmp_path, lines: str):
    kh = tmp_path / "known_hosts"
    kh.write_text(lines)
    root = R.make_root(tmp_path / "root", rel.fleet.hosts, defaults={"known_hosts": str(kh)})
    return root, kh


def test_changed_host_key_is_refused(rel, tmp_path):
    host = rel.h1
    snap = rel.ensure_baseline(host)
    real = (R.FLEET_ROOT / ".lab" / "ssh" / "known_hosts").read_text()
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    fake_pub = other.with_suffix(".pub").read_text().split()
    address = rel.fleet.addresses[host]
    forged = "".join(f"{line.split()[0]} {fake_pub[0]} {fake_pub[1]}\n" if _names(line, address) else line + "\n"
                     for line in real.splitlines())
    assert forged.split() != real.split()
    root, kh = _known_hosts_root(rel, tmp_path, forged)
    R.count("faults: host key changed")
    for extra in ([], ["--accept-new-host-key"]):
        r = R.fs(root, *extra, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
        assert r.returncode != 0, (r.stdout, r.stderr)
        assert "CHANGED" in r.stdout + r.stderr and "Traceback" not in r.stderr, (r.stdout, r.stderr)
        s = json.loads(R.fs(root, *extra, "status", host, "--json").stdout.strip().splitlines()[-1])
        assert not s["reachable"] and "CHANGED" in s["error"], s
    assert kh.read_text() == forged                 # never "fixed" by accepting the new key
    assert rel.lab.snapshot(host) == snap


def test_unknown_host_key_refused_by_default_and_recorded_only_when_asked(rel, tmp_path):
    host = rel.h1
    address = rel.fleet.addresses[host]
    real = (R.FLEET_ROOT / ".lab" / "ssh" / "known_hosts").read_text()
    without = "".join(line + "\n" for line in real.splitlines() if not _names(line, address))
    root, kh = _known_hosts_root(rel, tmp_path, without)
    R.count("faults: host key unknown")
    s = json.loads(R.fs(root, "status", host, "--json").stdout.strip().splitlines()[-1])
    assert not s["reachable"] and "unknown host key" in s["error"], s
    r = R.fs(root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
    assert r.returncode != 0 and "unknown host key" in r.stdout + r.stderr, (r.stdout, r.stderr)
    assert kh.read_text() == without
    s = json.loads(R.fs(root, "--accept-new-host-key", "status", host, "--json").stdout.strip().splitlines()[-1])
    assert s["reachable"], s
    added = kh.read_text()[len(without):]
    assert _names(added, address) and added.split()[2] in real, added
    assert oct((kh.stat().st_mode) & 0o777) in ("0o600", "0o644"), oct(kh.stat().st_mode)


ODD = "a b %s %% $HOME ${PATH} \"q\" 'x' `id` $(touch /tmp/fleetspec-pwned) ;\nsecond line\\t\\x41"


# every persistent place on a lab host where a command could leave a file (not /run, /tmp, logs or
# systemd's own timer stamps)
WRITABLE = ("/etc", "/opt", "/root", "/usr", "/srv", "/home", "/var/lib", "/var/cache")


def test_odd_flags_arrive_intact_and_secrets_never_leak(rel, tmp_path):
    """One deploy on the second host: a custom playbook adds --served-model-name with ODD and a
    secret env; the inventory names an api_key. Everything that fleetspec prints or writes is
    searched for the secret values."""
    host = rel.h2
    rel.ensure_baseline(host)
    token = "tok-" + secrets.token_hex(8) + " \"q\" $HOME `x` \\ end"
    api_key = "sk-" + secrets.token_hex(12)
    env = {"FS_REL_TOKEN": token, "FS_REL_API_KEY": api_key}

    def edit(data):
        data = R.quick_smoke(data)
        data["launch"]["flags"].append(["--served-model-name", ODD])
        data["launch"]["secret_env"] = ["FS_REL_TOKEN"]
        return data

    root = R.make_root(tmp_path / "root", rel.fleet.hosts, playbooks={"ddtree.yaml": edit},
                       inventory_vars={host: {"api_key": {"secret_env": "FS_REL_API_KEY"}}})
    outputs = []
    # --plan and status write nothing on the host (no fact cache, trust verdict, folder or bytecode):
    # what they would write is removed first, so that any write shows
    rel.lab.sh(host, "rm -rf /var/cache/fleetspec /var/lib/fleetspec/run/trusted-python.* && touch /run/fs-unchanged")
    plan = R.fs(root, "deploy", host, "--algo", "ddtree", "--plan", env=env, check_rc=0)
    outputs.append(plan.stdout + plan.stderr)
    outputs.append(R.fs(root, "status", host, env=env, check_rc=0).stdout)
    assert rel.lab.sh(host, f"find {' '.join(WRITABLE)} -xdev -path /var/lib/systemd -prune -o -newer /run/fs-unchanged "
                            f"-print 2>/dev/null; true") == ""
    assert "EnvironmentFile=" in plan.stdout and "served-model-name" in plan.stdout
    d = R.fs(root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates", env=env)
    outputs.append(d.stdout + d.stderr)
    assert d.returncode == 0, (d.stdout, d.stderr)
    j = R.fs(root, "status", host, "--json", env=env, check_rc=0)
    outputs.append(j.stdout + j.stderr)
    s = json.loads(j.stdout.strip().splitlines()[-1])
    release = s["release"]
    assert s["served_algo"] == "DDTREE", s
    for args in (["history", host], ["history", host, "--json"]):
        h = R.fs(root, *args, env=env, check_rc=0)
        outputs.append(h.stdout + h.stderr)

    lab = rel.lab
    try:
        # The odd flag reached the server byte for byte, through systemd, and ran nothing.
        info = json.loads(lab.sh(host, "curl -s http://127.0.0.1:30000/server_info"))
        assert f" --served-model-name {ODD} " in info["launch_command"] + " ", info["launch_command"]
        pid = lab.sh(host, f"systemctl show -p MainPID --value {R.SERVICE}").strip()
        raw = lab.fleet.run(host, f"cat /proc/{pid}/cmdline").stdout.decode()
        argv = raw.rstrip("\0").split("\0")                  # the exact argv the server runs with
        assert argv[argv.index("--served-model-name") + 1] == ODD, argv
        assert lab.rc(host, "test -e /tmp/fleetspec-pwned") != 0
        R.count("odd-flag deploys checked byte for byte")

        # The secret reached the service's environment, through a file only root can read.
        environ = lab.sh(host, f"cat /proc/{pid}/environ | tr '\\0' '\\n'")
        assert f"FS_REL_TOKEN={token}" in environ.splitlines(), environ
        secret_file = f"{R.STATE}/releases/{release}/secrets/env"
        assert lab.sh(host, f"stat -c '%a %U %G' {secret_file} $(dirname {secret_file})").split() == \
            ["600", "root", "root", "700", "root", "root"]

        # … and nowhere else: outputs, the ledger (host and mirror), manifests, drop-ins, systemd's
        # view of the unit, the journal.
        dump = lab.sh(host, f"cat {R.STATE}/ledger.jsonl {R.STATE}/releases/{release}/manifest.json "
                            f"{R.DROPIN_DIR}/*.conf {R.STATE}/releases/{release}/unit/* "
                            f"{R.STATE}/releases/{release}/rollback.sh; systemctl show {R.SERVICE}; "
                            f"systemctl cat {R.SERVICE}; journalctl -u {R.SERVICE} -n 300 --no-pager")
        mirror = "".join(p.read_text() for p in (root / ".fleetspec").rglob("*") if p.is_file())
        for where, text in [("outputs", "\n".join(outputs)), ("host files", dump), ("local mirror", mirror)]:
            for name, value in (("secret_env", token), ("api_key", api_key)):
                assert value not in text, f"{name} leaked into {where}"
                assert json.dumps(value)[1:-1] not in text, f"{name} leaked (JSON-escaped) into {where}"
        R.count("secret leak checks", 6)
        assert "EnvironmentFile=" in dump
        _check_modes(rel, host)
    finally:
        R.fs(root, "rollback", host, env=env)
    rel.assert_on_baseline(host)


def _check_modes(rel, host):
    """Owner root, nothing group/world-writable under fleetspec's state; the state folder and the
    baseline 0700, ledger and baseline.json 0600 (issue 13 item 3)."""
    out = rel.lab.sh(host, f"find /var/lib/fleetspec {R.DROPIN_DIR} -path '*/overlay/*' -prune -o "
                           f"-printf '%m %u %g %y %p\\n'")
    bad = []
    for line in out.splitlines():
        mode, user, group, kind, path = line.split(" ", 4)
        if kind == "l":
            continue
        if user != "root" or int(mode, 8) & 0o022:
            bad.append(line)
    assert not bad, "\n".join(bad[:20])
    modes = dict(line.split(" ", 1)[::-1] for line in rel.lab.sh(
        host, f"stat -c '%a %n' {R.STATE}/ledger.jsonl {R.STATE}/baseline {R.STATE}/baseline/baseline.json").splitlines())
    assert modes == {f"{R.STATE}/ledger.jsonl": "600", f"{R.STATE}/baseline": "700",
                     f"{R.STATE}/baseline/baseline.json": "600"}, modes     # the baseline holds drop-ins' bytes
    assert rel.lab.sh(host, f"stat -c %a {R.STATE}").strip() == "700"
    R.count("file mode checks")
