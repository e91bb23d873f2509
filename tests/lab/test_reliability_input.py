"""Invariant 4: bad input never changes a host. A table of bad inputs, each through the real CLI
against a real lab host, in a fleet root of its own: exit 2 (or 1 where the host itself refused it
before the switch), one clear line, no traceback, and the host's files hashed before and after
identical (for exit 2: everything, fleetspec's own state folder included; for exit 1: the unit, its
drop-ins, `current`, sglang's files, the running service).

Inventory and playbook schema errors already have their table (tests/unit/test_bad_input.py, 21
cases); these are the rest: patch sets, kernels, options, CLI, templates, sizes, secrets, names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.lab import reliability_lab as R

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PS = {0: "sglang-0.5.13.post1", 1: "sglang-0.5.23"}


@pytest.fixture(scope="session")
def rel(lab_fleet, tmp_path_factory):
    return R.rel_fixture(lab_fleet, tmp_path_factory)


# Root builders: each gets (root folder, host slot) and edits what the case needs -----------------
def _copy_patchset(root: Path, slot: int) -> Path:
    """A private copy of the real (generated) patch set for the host's version, wired into ddtree.yaml."""
    from fleetspec.build.patchset import load_patchset

    src = load_patchset(R.ROOT / "playbooks" / "ddtree" / "patches" / PS[slot]).root
    dest = root / "playbooks" / "bad" / "patchsets" / PS[slot]
    shutil.copytree(src, dest)
    pb = root / "playbooks" / "ddtree.yaml"
    text = pb.read_text().replace(f"ddtree/patches/{PS[slot]}", f"bad/patchsets/{PS[slot]}")
    pb.write_text(text)
    return dest


def _manifest(dest: Path, edit) -> None:
    m = dest / "manifest.json"
    data = json.loads(m.read_text())
    edit(data)
    m.write_text(json.dumps(data, indent=2))


def _first(data, action=None):
    return next(f for f in data["files"] if action is None or f["action"] == action)


def ps_edit(edit):
    return lambda root, slot: _manifest(_copy_patchset(root, slot), edit)


def ps_files(fn):
    return lambda root, slot: fn(_copy_patchset(root, slot))


def _copy_kernel(root: Path) -> Path:
    from fleetspec.model.kernel import built_kernels

    # the lab hosts' CPU build: a cache that also holds a CUDA build (FLEETSPEC_CUDA_BUILD=1) may list it first
    build = next(k for k in built_kernels(R.ROOT / "playbooks" / "ddtree" / "kernels" / "tree_mask") if k.abi.cuda == "cpu")
    dest = root / "playbooks" / "badk" / "tree_mask"
    shutil.copytree(build.spec.root, dest)
    pb = root / "playbooks" / "ddtree.yaml"
    pb.write_text(pb.read_text().replace("ddtree/kernels/tree_mask", "badk/tree_mask"))
    return dest


def kernel_build(**changes):
    def setup(root, slot):
        k = _copy_kernel(root) / "kernel.json"
        data = json.loads(k.read_text())
        data["build"].update(changes)
        k.write_text(json.dumps(data))
    return setup


def kernel_spec(**changes):
    def setup(root, slot):
        k = _copy_kernel(root) / "kernel.json"
        data = json.loads(k.read_text())
        data.update(changes)
        k.write_text(json.dumps(data))
    return setup


def kernel_so_changed(root, slot):
    k = _copy_kernel(root)
    so = next(k.glob("*.so"))
    so.write_bytes(so.read_bytes() + b"\0")


def _symlink_in(dest: Path):
    target = next(p for p in (dest / "files").rglob("*.py"))
    target.unlink()
    target.symlink_to("/etc/passwd")


def _unlisted_file(dest: Path):
    (dest / "files" / "sglang" / "srt" / "speculative" / "stowaway.py").write_text("import os\n")


def _changed_content(dest: Path):
    f = next(p for p in (dest / "files").rglob("ddtree_utils.py"))
    f.write_bytes(f.read_bytes() + b"\nimport os; os.system('touch /tmp/pwned')\n")


def _huge_file(dest: Path):
    f = dest / "files" / "sglang" / "srt" / "speculative" / "huge_table.py"
    with open(f, "wb") as fh:
        fh.truncate(3 << 30)          # 3 GiB, sparse: costs nothing here unless someone reads it
    _manifest(dest, lambda d: d["files"].append({"path": "sglang/srt/speculative/huge_table.py", "action": "add",
                                                 "sha256": "0" * 64}))


def playbook_text(text):
    def setup(root, slot):
        (root / "playbooks" / "ddtree.yaml").write_text(text)
    return setup


def playbook_edit(fn):
    def setup(root, slot):
        import yaml

        p = root / "playbooks" / "ddtree.yaml"
        data = yaml.safe_load(p.read_text())
        fn(data)
        p.write_text(yaml.safe_dump(data, sort_keys=False))
    return setup


def template(name, text):
    def setup(root, slot):
        (root / "templates" / name).write_text(text)
    return setup


def inventory_vars(**values):
    def setup(root, slot):
        import yaml

        p = root / "inventory" / "lab.yaml"
        data = yaml.safe_load(p.read_text())
        for h in data["hosts"].values():
            h["vars"].update(values)
        p.write_text(yaml.safe_dump(data, sort_keys=False))
    return setup


BOMB = ("algo: ddtree\nspeculative_algorithm: DDTREE\n"
        "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
        "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
        "launch: {flags: [[--speculative-algorithm, DDTREE]], env: {X: *h}}\n")

# A drop-in that forgets to clear ExecStart= first (systemd refuses the unit), and one with a
# setting systemd cannot parse (it would silently ignore it).
NO_CLEAR = open(R.ROOT / "templates" / "fleetspec-dropin.conf.j2").read().replace("ExecStart=\n", "", 1)
BAD_SETTING = open(R.ROOT / "templates" / "fleetspec-dropin.conf.j2").read() + "TimeoutStartSec=whenever-it-likes\n"

DEPLOY = ["deploy", "{host}", "--algo", "ddtree", "--yes", "--no-gates"]

# id, host slot, setup(root, slot) or None, CLI args, exit code, what the one line must say
CASES = [
    ("ps-path-traversal", 1, ps_edit(lambda d: _first(d).update(path="../../../etc/cron.d/fleetspec")), DEPLOY, 2,
     "a path without '', '.' or '..' parts"),
    ("ps-absolute-path", 1, ps_edit(lambda d: _first(d).update(path="/etc/passwd")), DEPLOY, 2,
     "a relative POSIX path"),
    ("ps-dotdot-inside-package", 0, ps_edit(lambda d: _first(d).update(path="sglang/../../../../tmp/x.py")), DEPLOY, 2,
     "'..' parts"),
    ("ps-outside-package", 0, ps_edit(lambda d: _first(d, "add").update(path="torch/ddtree_hook.py")), DEPLOY, 2,
     "a path inside sglang"),
    ("ps-newline-in-path", 0, ps_edit(lambda d: _first(d, "add").update(path="sglang/srt/x\n.py")), DEPLOY, 2,
     "a relative POSIX path"),
    ("ps-symlink", 1, ps_files(_symlink_in), DEPLOY, 2, "symlinks are refused"),
    ("ps-unlisted-file", 0, ps_files(_unlisted_file), DEPLOY, 2, "stowaway.py is not"),
    ("ps-content-changed-since-build", 1, ps_files(_changed_content), DEPLOY, 2, "sha256"),
    ("ps-base-drift", 0, ps_edit(lambda d: _first(d, "replace").update(base_sha256="ab" * 32)), DEPLOY, 2,
     "differs from sglang==0.5.13.post1"),
    ("ps-other-version", 1, ps_edit(lambda d: d.update(version="0.5.22")), DEPLOY, 2, "is for sglang==0.5.22"),
    ("ps-not-json", 1, ps_files(lambda dest: (dest / "manifest.json").write_text("{\"package\": ")), DEPLOY, 2,
     "valid JSON"),
    ("ps-huge-file", 1, ps_files(_huge_file), DEPLOY, 2, "MiB"),
    ("kernel-other-torch", 1, kernel_build(torch="2.11.0+cu128"), DEPLOY, 2, "built for torch 2.11.0+cu128"),
    ("kernel-other-python", 0, kernel_build(python_tag="cp312"), DEPLOY, 2, "built for python cp312"),
    ("kernel-other-cxx11-abi", 1, kernel_build(cxx11_abi=False), DEPLOY, 2, "C++11 ABI"),
    ("kernel-library-changed", 1, kernel_so_changed, DEPLOY, 2, "changed since the build"),
    ("kernel-source-traversal", 1, kernel_spec(sources=["../../../../etc/passwd"]), DEPLOY, 2,
     "sources: a list of plain file or op names"),
    ("algo-path-traversal", 1, None, ["deploy", "{host}", "--algo", "../../etc/passwd", "--yes"], 2, "unknown algo"),
    ("set-wrong-type", 1, None, [*DEPLOY, "--set", "budget=lots"], 2, "expected int"),
    ("set-unknown-option", 1, None, [*DEPLOY, "--set", "nosuch=1"], 2, "nosuch"),
    ("set-without-value", 1, None, [*DEPLOY, "--set", "budget"], 2, "expected NAME=VALUE"),
    ("set-bad-choice", 1, None, [*DEPLOY, "--set", "verify=sideways"], 2, "sideways"),
    ("set-typo-past-hybrid-guard", 0, None, [*DEPLOY, "--set", "verify=shadow_linear"], 2, "shadow_linear"),
    ("unknown-cli-option", 1, None, [*DEPLOY, "--frobnicate"], 2, "No such option"),
    ("bad-mode", 1, None, [*DEPLOY, "--mode", "sideways"], 2, "sideways"),
    ("bad-serial", 1, None, [*DEPLOY, "--serial", "half"], 2, "--serial 'half'"),
    ("host-not-in-inventory", 1, None, ["deploy", "ct999", "--algo", "ddtree", "--yes"], 2, "unknown host 'ct999'"),
    ("yaml-alias-bomb", 1, playbook_text(BOMB), DEPLOY, 2, "ddtree.yaml"),
    ("env-name-invalid", 1, playbook_edit(lambda d: d["launch"].update(env={"BAD-NAME": "1"})), DEPLOY, 2,
     "environment names"),
    ("secret-env-unset", 1, playbook_edit(lambda d: d["launch"].update(secret_env=["FS_REL_NEVER_SET"])), DEPLOY, 2,
     "FS_REL_NEVER_SET"),
    ("template-undefined-name", 1, template("fleetspec-dropin.conf.j2", "[Service]\nExecStart={{ no_such_thing }}\n"),
     DEPLOY, 2, "fleetspec-dropin.conf.j2"),
    ("python-missing", 1, inventory_vars(python="/nonexistent/bin/python3"), DEPLOY, 2,
     "no sglang found for python /nonexistent/bin/python3"),
    ("service-name-traversal", 1, inventory_vars(service="../../../tmp/evil.service"), ["rollback", "{host}"], 2,
     "service"),
    ("service-name-shell", 1, inventory_vars(service="x;touch /tmp/pwned.service"), DEPLOY, 2, "service"),
    ("unit-without-execstart-clear", 1, template("fleetspec-dropin.conf.j2", NO_CLEAR), [*DEPLOY, "--json"], 1,
     "more than one ExecStart="),
    ("unit-with-unparsable-setting", 1, template("fleetspec-dropin.conf.j2", BAD_SETTING), [*DEPLOY, "--json"], 1,
     "Failed to parse TimeoutStartSec"),
]


@pytest.fixture(scope="module")
def hosts_before(rel):
    """Each host on its baseline, and its files hashed once: every case must leave them so."""
    out = {}
    for host in (rel.h1, rel.h2):
        rel.ensure_baseline(host)
        out[host] = _hashes(rel, host)
    return out


def _hashes(rel, host) -> dict:
    site = "/root/ml-env/lib/python3.11/site-packages" if host == rel.h1 else "/opt/sglang/venv/lib/python3.11/site-packages"
    lab = rel.lab
    return {
        "systemd": lab.tree_hash(host, "/etc/systemd/system"),
        "current": lab.sh(host, f"readlink {R.STATE}/current || true"),
        "service": lab.main_pid(host),
        "sglang": lab.sh(host, f"cd {site} && find sglang -type f -name '*.py' -print0 | sort -z | xargs -0 sha256sum "
                               f"| sha256sum"),
        "state": lab.tree_hash(host, "/var/lib/fleetspec"),
        "pwned": lab.sh(host, "ls /tmp/pwned /tmp/evil 2>&1 || true"),
    }


@pytest.mark.parametrize("name,slot,setup,args,code,says", CASES, ids=[c[0] for c in CASES])
def test_bad_input_changes_nothing(rel, hosts_before, tmp_path, name, slot, setup, args, code, says):
    host = rel.fleet.hosts[slot]
    root = R.make_root(tmp_path / "root", rel.fleet.hosts, playbooks={"ddtree.yaml": R.quick_smoke})
    if setup is not None:
        setup(root, slot)
    r = R.fs(root, *[a.replace("{host}", host) for a in args], timeout=300)
    R.count("bad-input cases")
    out = r.stdout + r.stderr
    assert r.returncode == code, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in out, out
    err = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith(("Usage:", "Try "))]
    if code == 2:
        assert len(err) == 1, r.stderr
        assert says in err[0], err[0]
        assert not r.stdout.strip() or "[" in r.stdout, r.stdout        # nothing but step lines, if any
    else:                                       # refused by the host itself, before the switch
        outcome = json.loads(r.stdout.strip().splitlines()[-1])
        assert outcome["status"] == "failed" and outcome["failed_step"] == "render", outcome
        assert says in outcome["reason"], outcome
    after = _hashes(rel, host)
    before = hosts_before[host]
    keys = ("systemd", "current", "service", "sglang", "pwned") + (("state",) if code == 2 else ())
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys}
    if code != 2:
        hosts_before[host]["state"] = after["state"]     # the refused release is recorded (failed)
