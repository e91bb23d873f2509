"""Security, second audit: what a hostile host, a local user or a careless inventory could still do.

Each test drives fleetspec's own functions against real things (the loopback sshd and its shell,
real files, the real option tables and parsers); each failed on the code before its fix.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetspec import systemd_unit
from fleetspec.model import launch
from fleetspec.model.baseline import Baseline
from fleetspec.model.playbook import load_playbook
from fleetspec.ops.hoststate import HostState

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "sglang-test.service"


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# Secrets in ExecStart: redacted by option name -------------------------------------------------
SECRET_UNIT = ("[Service]\nExecStart=/opt/venv/bin/python3 -m sglang.launch_server --model-path /m "
               "--admin-api-key adm1n-S3CRET --ssl-keyfile /etc/k.pem --ssl-keyfile-password=pw-S3CRET "
               "--api-key sk-S3CRET --port 30000 --speculative-algorithm EAGLE\n")
SECRETS = ("adm1n-S3CRET", "pw-S3CRET", "sk-S3CRET")


def _secret_preflight(t):
    from fleetspec.ops.argv import LaunchPlan
    from fleetspec.ops.options import ResolvedOptions
    from fleetspec.ops.preflight_result import Preflight

    cmd = systemd_unit.effective_exec_command(SECRET_UNIT)
    form = launch.classify(list(cmd.argv), path=cmd.path, prefix=cmd.flags)
    derived = launch.derive(form, launch.load_table("0.5.23"), ["--speculative-algorithm", "DDTREE"])
    playbook = load_playbook(ROOT / "playbooks" / "ddtree.yaml")
    return Preflight(host=t.host, root=ROOT, playbook=playbook, service=SERVICE, python=sys.executable,
                     unit=None, unit_bytes=SECRET_UNIT.encode(), dropins={}, exec_argv=list(form.argv),
                     sglang=SimpleNamespace(version="0.5.23", site_packages="/opt/venv/site-packages", drift=()),
                     torch=None, hybrid=False, options=ResolvedOptions(values={"budget": 64}), new_argv=derived.argv,
                     patchset=None, kernels=[], form=form,
                     launch=LaunchPlan(form=form, derived=derived))


def test_secret_options_in_execstart_are_redacted_in_plan_ledger_mirror_and_history(t, tmp_path):
    """--admin-api-key, --ssl-keyfile-password and --api-key (the inventory names no api_key)
    used to reach --plan, the preflight ledger line, the mirror and `history --json` verbatim;
    the baseline keeps the unit's bytes exact, 0600."""
    from fleetspec.model import ledger as L
    from fleetspec.ops import history, planning

    assert t.host.vars.api_key is None
    pf = _secret_preflight(t)
    assert all(s in " ".join(pf.new_argv) for s in SECRETS)          # the derived command keeps them
    mirror = tmp_path / "mirror"
    state = HostState(t, "h", SERVICE, root=tmp_path / "state", mirror=mirror, redact=pf.redact)
    shown = json.dumps(planning.plan(t, pf, state).to_dict())
    state.record(L.Entry.step("r1", "preflight", L.StepState.OK, **pf.summary()))
    for text in (shown, (tmp_path / "state" / "sglang-test" / "ledger.jsonl").read_text(),
                 (mirror / "ledger.jsonl").read_text()):
        assert "<redacted>" in text and not any(s in text for s in SECRETS), text
    assert "--ssl-keyfile" in shown and "/etc/k.pem" in shown      # a path is not a secret
    # a line an older version wrote unredacted is hidden when history reads it back
    old = L.Entry.step("r0", "preflight", L.StepState.OK, argv=list(pf.exec_argv)).to_line()
    with open(tmp_path / "state" / "sglang-test" / "ledger.jsonl", "a") as f:
        f.write(old + "\n")
    state_root = HostState(t, "h", SERVICE, root=tmp_path / "state")
    read = history._redacted(state_root.ledger_with_archive())
    assert not any(s in e.to_line() for e in read.entries for s in SECRETS)
    # the baseline: exact unit bytes, 0600
    baseline = Baseline(service=SERVICE, unit_path="/etc/systemd/system/" + SERVICE, unit_bytes=SECRET_UNIT.encode(),
                        dropins={}, exec_argv=list(pf.exec_argv), environment={}, sglang={},
                        served_algorithm="EAGLE", declared_algorithm="EAGLE", modes={"/etc/systemd/system/" + SERVICE: 0o644})
    state.write_baseline(baseline)
    folder = tmp_path / "state" / "sglang-test" / "baseline"
    assert (folder / "unit").read_bytes() == SECRET_UNIT.encode() and mode(folder / "baseline.json") == 0o600
    assert Baseline.from_json((folder / "baseline.json").read_text()).unit_bytes == SECRET_UNIT.encode()
    assert mode(mirror / "baseline.json") == 0o600


def test_the_secret_options_are_the_ones_both_parsers_know():
    from fleetspec.ops.redaction import SECRET_OPTIONS, argv_secrets, is_secret_option

    for version in ("0.5.13.post1", "0.5.23"):
        table = launch.load_table(version)
        assert all(o in table.options for o in SECRET_OPTIONS), version
    assert argv_secrets(["--adm", "a1", "--ssl-keyfile", "/k", "--ssl-keyfile-pass=p2", "--api-key=k3"]) == [
        "a1", "p2", "k3"]
    assert not is_secret_option("--ssl-keyfile") and not is_secret_option("--port")


# Terminal escapes from a host: made visible at the output boundary -------------------------------
OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"            # set the clipboard to `rm -rf ~`
HOSTILE = f"EAGLE{OSC52}\x9b2J\u202ex\x1b[8mhidden\r"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def _clean(text: str) -> None:
    assert not any(c in text for c in RAW), repr(text)
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07" in text and "\\x9b" in text and "\\u202e" in text, repr(text)


def test_history_prints_a_probe_reason_with_escape_sequences_made_visible(tmp_path):
    """A probe reason the host sent (kept in the ledger) printed through the real CLI: Click
    stripped only CSI off a terminal, so OSC 52 and C1 controls reached the screen."""
    from click.testing import CliRunner

    from fleetspec.cli import main
    from fleetspec.model import ledger as L
    from fleetspec.model.layout import local_mirror

    for sub in ("inventory", "playbooks", "templates"):
        (tmp_path / sub).mkdir()
    (tmp_path / "inventory" / "key").write_text("k")
    (tmp_path / "inventory" / "lab.yaml").write_text(
        "defaults: {ssh_key: key, known_hosts: kh, connect_timeout: 1}\n"
        "hosts:\n  a: {address: 127.0.0.1, port: 1, vars: {service: sglang-test.service}}\n")
    mirror = local_mirror(tmp_path, SimpleNamespace(name="a", address="127.0.0.1", port=1), "sglang-test.service")
    mirror.mkdir(parents=True)
    lines = [L.Entry.step("r1", "probes", L.StepState.FAILED, reason=f"/server_info says {HOSTILE}").to_line(),
             L.Entry.status("r1", L.ROLLED_BACK, reason=f"probes: {HOSTILE}").to_line()]
    (mirror / "ledger.jsonl").write_text("".join(line + "\n" for line in lines))
    for args in (["history", "a"], ["history", "a", "r1"]):
        r = CliRunner().invoke(main, ["--root", str(tmp_path), *args])
        assert r.exit_code == 0, r.output
        _clean(r.output)


def test_status_and_the_deploy_summary_print_host_text_made_visible(capsys):
    """The served algorithm (status), a probe reason and journal lines (the deploy summary)."""
    from fleetspec.cli import deploy_cmd, status_cmd
    from fleetspec.ops.outcome import DeployOutcome, Outcome
    from fleetspec.ops.status import HostStatus

    status_cmd._emit([HostStatus(host="a", address="127.0.0.1:22", service=SERVICE, reachable=True, health="ok",
                                 algo=HOSTILE, served_algo=HOSTILE, state="active/running")], False)
    deploy_cmd._print_deploy_summary([DeployOutcome(host="a", status=Outcome.ROLLED_BACK, reason=f"probes: {HOSTILE}",
                                                    evidence={"journal": [f"engine: {HOSTILE}"]})])
    got = capsys.readouterr()
    _clean(got.out)
    _clean(got.err)


def test_nothing_in_the_cli_prints_around_the_output_boundary():
    """Every line goes through cli/output.py (echo, Out, Progress): no other printer in cli/."""
    import re

    cli = ROOT / "fleetspec" / "cli"
    for path in cli.glob("*.py"):
        if path.name in ("output.py", "terminal.py"):
            continue
        text = path.read_text()
        assert not re.search(r"click\.(echo|secho)\(|(?<![\w.])print\(|sys\.std(out|err)\.write", text), path


# Malformed answers from a host: FleetspecErrors at the boundary; a revert and a fleet go on ------
class RawServer:
    """Answers every request on 127.0.0.1 with `self.reply` (bytes, as sent), then closes."""

    def __init__(self):
        import socket
        import threading

        self.reply = b""
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def answer(self, body: bytes, *headers: str, status: str = "200 OK") -> None:
        head = [f"HTTP/1.1 {status}", "Content-Type: application/json", *headers]
        if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
            head.append(f"Content-Length: {len(body)}")
        self.reply = ("\r\n".join(head) + "\r\n\r\n").encode() + body

    def close(self):
        self.sock.close()


@pytest.fixture
def raw():
    server = RawServer()
    yield server
    server.close()


DEEP = b"[" * 200_000 + b"]" * 200_000
MALFORMED = {"a list": (b"[1, 2]", ()), "deep nesting": (DEEP, ()), "a string": (b'"DDTREE"', ()),
             "bad Content-Length": (b"{}", ("Content-Length: 12abc",)),
             "bad chunk size": (b"zz\r\n{}\r\n0\r\n\r\n", ("Transfer-Encoding: chunked",))}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_answer_is_a_remote_error_or_a_failed_probe_never_an_exception(t, raw, case):
    """A /server_info that is a list, deep JSON and a bad Content-Length raised AttributeError,
    RecursionError and ValueError out of the probes, /server_info, /generate and the gates."""
    from fleetspec.errors import RemoteError
    from fleetspec.ops import gates, probes
    from fleetspec.remote.facts import server_info

    body, headers = MALFORMED[case]
    raw.answer(body, *headers)
    with pytest.raises(RemoteError, match=r"^h: (fact server_info|/server_info|http://127)"):
        server_info.fetch(t, raw.port)
    spec = probes.ProbeSpec(port=raw.port, expected_algorithm="DDTREE")
    got = probes._after_ready(t, spec, 0.0)
    assert not got.ok and got.stage in ("health", "server_info"), got
    assert probes.generate(t, spec, "x", 4)["ok"] is False
    m = gates.measure(t, raw.port, prompts=("p",), rounds=1)
    assert len(m.prompt_errors) == 1 and not m.outputs


def _switched_deploy(t, tmp_path, monkeypatch):
    """A real Deploy on the loopback host, its preflight stood in, that fails after the switch."""
    import time as _time
    from pathlib import PurePosixPath

    from fleetspec.model.layout import HostLayout
    from fleetspec.model.playbook import Smoke
    from fleetspec.ops.deploy import Deploy, DeployRequest, StepFailed

    unit = b"[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server\n"
    pf = SimpleNamespace(staged_ahead=None, container_facts=None, unit_bytes=unit, dropins={}, redact=lambda text: text,
                         summary=lambda: {}, baseline=None, playbook=None, gpu_health=None)

    def stage(self):
        self.switched = True
        raise StepFailed("probes", "the new engine did not answer")
    monkeypatch.setattr(Deploy, "_stage", stage)
    d = Deploy(t, DeployRequest(host=t.host, playbook=SimpleNamespace(algo="ddtree", smoke=Smoke()), root=tmp_path),
               pf, echo=lambda line: None)
    d.state.layout = HostLayout("svc.service", root=PurePosixPath(str(tmp_path / "state")))
    d.state.write_baseline(Baseline(service="svc.service", unit_path="/etc/systemd/system/svc.service",
                                    unit_bytes=unit, dropins={}, exec_argv=[], environment={}, sglang={},
                                    served_algorithm=None, declared_algorithm=None, taken_at=_time.time()))
    return d


@pytest.mark.parametrize("how", ["probe of a list", "any other error"])
def test_a_revert_that_meets_a_malformed_answer_writes_revert_failed(t, raw, tmp_path, monkeypatch, how):
    """The revert's probe error escaped Deploy._revert with a traceback and no "revert failed" line."""
    from fleetspec.model import ledger as L
    from fleetspec.ops import activation, probes

    raw.answer(b"[]")

    def revert_to(*a, **k):
        if how == "any other error":
            raise RecursionError("maximum recursion depth exceeded")
        return probes._after_ready(t, probes.ProbeSpec(port=raw.port, expected_algorithm="NONE"), 0.0)
    monkeypatch.setattr(activation, "revert_to", revert_to)
    d = _switched_deploy(t, tmp_path, monkeypatch)
    out = d.run()
    assert out.status == "needs_attention" and out.exit_code == 3 and "the revert failed too" in out.reason
    ledger = L.parse((tmp_path / "state" / "svc" / "ledger.jsonl").read_text())
    assert any(e.name == "revert" and e.state == "failed" for e in ledger.entries), ledger.entries


def test_a_host_whose_deploy_raises_anything_is_an_outcome_and_the_abort_still_rolls_back(monkeypatch, tmp_path):
    """deploy_one caught only FleetspecError: any other error ended the whole fleet with a
    traceback, and --rollback-all-on-abort never ran for the hosts already moved."""
    from fleetspec.ops import fleet
    from fleetspec.ops.deploy import DeployOutcome

    def deploy(t, req, **kw):
        if req.host.name == "a":
            return DeployOutcome("a", "healthy", "R-a-new", previous="baseline")
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")
    monkeypatch.setattr(fleet, "deploy", deploy)
    went = {}
    monkeypatch.setattr("fleetspec.ops.rollback.rollback", lambda t, h, root, to, **k: went.setdefault(h.name, to))
    hosts = [SimpleNamespace(name="a"), SimpleNamespace(name="b")]
    strategy = fleet.Strategy.parse(2, canary=0, serial="1", max_fail="0", parallel=0, rollback_all_on_abort=True)
    lines = []
    out = {o.host: o for o in fleet.deploy_fleet(hosts, SimpleNamespace(algo="ddtree"), connect=lambda h: None,
                                                  root=tmp_path, options={}, strategy=strategy, echo=lines.append)}
    assert out["b"].status == "failed" and "internal error: RecursionError" in out["b"].reason
    assert went == {"a": None} and out["a"].status == "rolled_back"


# A patches folder's `add` line: its path in site-packages stays inside the build ---------------------
@pytest.mark.parametrize("dest", ["sglang/../../../escape.py", "../outside.py", "sglang/./x.py", "sglang//x.py",
                                  "sglang/srt/../../../../tmp/d/", "sglang\\..\\x.py"])
def test_an_add_line_whose_site_packages_path_leaves_the_build_is_refused_at_load(tmp_path, dest):
    """`..` in the destination wrote outside the build folder on the controller, and the file was
    silently left out of the patch set."""
    from fleetspec.build.patchset import load_recipe
    from fleetspec.errors import ConfigError

    root = tmp_path / "sglang-0.5.23"
    (root / "payload").mkdir(parents=True)
    (root / "series").write_text("")
    (root / "payload" / "x.py").write_text("X = 1\n")
    src = "payload/" if dest.endswith("/") else "payload/x.py"
    (root / "add").write_text(f"# comment\nsglang/srt/ok.py payload/x.py\n{dest} {src}\n")
    with pytest.raises(ConfigError, match=r"sglang-0\.5\.23/add: line 3: .*plain parts .*got '"):
        load_recipe(root)
    (root / "add").write_text("sglang/srt/ok.py ../sglang-0.5.23/payload/x.py\n")   # a source may be shared
    assert [d for d, _ in load_recipe(root).adds] == ["sglang/srt/ok.py"]


# Caps on what a host sends; non-regular files refused where a file is expected ----------------------
def test_a_config_json_linked_to_dev_zero_or_too_big_is_refused_not_read(t, tmp_path):
    """Preflight `cat` a config.json that links to /dev/zero until its deadline, keeping all of it."""
    from fleetspec.remote import facts
    from fleetspec.remote.facts import model_config

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").symlink_to("/dev/zero")
    with pytest.raises(facts.FactError, match=r"^h: fact model_config: .*config.json is not a regular file"):
        facts.gather(t, model_config, timeout=60, path=str(model))     # refused on sight, not at the deadline
    (model / "config.json").unlink()
    (model / "config.json").write_text('{"pad": "' + "x" * (4 * 1024 * 1024) + '"}')
    with pytest.raises(facts.FactError, match=r"config.json is larger than 4 MiB"):
        facts.gather(t, model_config, timeout=10, path=str(model))
    (model / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    assert facts.gather(t, model_config, path=str(model)).architectures == ["Qwen3ForCausalLM"]


def test_files_that_are_not_regular_are_refused_where_a_file_is_expected(t, tmp_path):
    from fleetspec.errors import RemoteError
    from fleetspec.remote import files

    with pytest.raises(RemoteError, match=r"/dev/zero: not a regular file; refusing to read it"):
        files.read_text(t, "/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(RemoteError, match=r"fifo: not a regular file"):
        files.read_text(t, str(tmp_path / "fifo"))
    with pytest.raises(RemoteError, match=r"^h: /dev/zero is not a regular file"):
        t.get_bytes("/dev/zero")
    (tmp_path / "ok").write_bytes(b"ok\n")
    assert files.read_text(t, str(tmp_path / "ok")) == "ok\n" and t.get_bytes(str(tmp_path / "ok")) == b"ok\n"


def test_command_output_and_http_answers_are_capped(t, raw, monkeypatch):
    """Output was buffered whole until the deadline: `yes` kept the controller's memory growing."""
    from fleetspec.errors import RemoteError
    from fleetspec.remote import limits

    monkeypatch.setattr(limits, "COMMAND_OUTPUT_MAX", 1024 * 1024)
    # the cap ends each command, whatever the machine's speed: the deadline is far past it
    with pytest.raises(RemoteError, match=r"^h: yes wrote more than 1 MiB on stdout; fleetspec reads at most"):
        t.run_script("yes", timeout=60)
    with pytest.raises(RemoteError, match=r"wrote more than 1 MiB on stderr"):
        t.run_script("yes >&2", timeout=60)
    assert len(t.run_script("head -c 1000000 /dev/zero", timeout=10, check=True).stdout_bytes) == 1000000
    monkeypatch.setattr(limits, "HTTP_BODY_MAX", 1024 * 1024)
    raw.reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + b" " * (2 * 1024 * 1024)
    with pytest.raises(RemoteError, match=r"^h: http://127.0.0.1:\d+/health: the answer runs past 1 MiB"):
        t.http("GET", raw.port, "/health", timeout=60)
    raw.answer(b"{}")
    assert t.http("GET", raw.port, "/health").json() == {}


# The fleet root, its templates and its known_hosts: only what root's operator controls ---------------
def test_a_known_hosts_that_is_an_authorized_keys_file_is_refused(tmp_path, sshd, ssh_client_key, inventory_writer):
    """With accept-new and known_hosts: ~/.ssh/authorized_keys, the host's key line was appended to
    root's authorized_keys."""
    from fleetspec.errors import ConfigError
    from fleetspec.model.inventory import load_inventory
    from fleetspec.remote.transport import Transport

    ssh = tmp_path / ".ssh"
    ssh.mkdir(mode=0o700)
    keys = ssh / "authorized_keys"
    keys.write_text(Path(f"{ssh_client_key}.pub").read_text())
    before = keys.read_bytes()
    inv = inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key, known_hosts=keys, policy="accept-new",
                           trust=False)
    with pytest.raises(ConfigError, match=r"inv.yaml: defaults.known_hosts: expected a known_hosts file, got "
                                          r".*/.ssh/authorized_keys is an authorized_keys file"):
        load_inventory(inv)
    other = tmp_path / "keys"                     # an authorized_keys file by content, under another name
    other.write_bytes(before)
    with pytest.raises(ConfigError, match=r"keys line 1 is not a known_hosts line"):
        load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key, known_hosts=other,
                                        policy="accept-new", trust=False))
    good = tmp_path / "known_hosts"
    host = load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key, known_hosts=good,
                                           policy="accept-new", trust=False)).hosts["h"]
    t = Transport(host, accept_new_host_key=True)
    try:
        assert t.run(["true"]).ok
    finally:
        t.close()
    assert good.read_text() == sshd.known_hosts_line and keys.read_bytes() == before


def test_templates_and_playbook_flags_are_sandboxed(tmp_path):
    """A planted template ran Python as the user rendering it (root)."""
    import jinja2

    from fleetspec import render
    from fleetspec.errors import UserError
    from fleetspec.ops import flags

    marker = tmp_path / "PWNED"
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "evil.j2").write_text(
        "{{ cycler.__init__.__globals__.os.system('touch " + str(marker) + "') }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        render.environment(tmp_path).get_template("evil.j2").render()
    playbook = SimpleNamespace(path="p.yaml", launch=SimpleNamespace(flags=[SimpleNamespace(
        when=None, tokens=["{{ host.__class__.__mro__[1].__subclasses__() }}"])]))
    with pytest.raises(UserError, match=r"p.yaml: launch.flags\[0\]: bad template: .*unsafe"):
        flags.render_flags(playbook, {"a": 1}, {})
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the check applies to root")
def test_root_refuses_a_fleet_root_that_others_can_change(tmp_path):
    """Root running fleetspec in a folder under /tmp or another user's home used that user's
    inventory, playbooks and templates."""
    import pwd

    from click.testing import CliRunner

    from fleetspec.cli import main
    from fleetspec.errors import UserError
    from fleetspec.root import find_root

    nobody = pwd.getpwnam("nobody").pw_uid
    root = tmp_path / "fleet"
    for sub in ("inventory", "playbooks/ddtree", "templates"):
        (root / sub).mkdir(parents=True)
    (root / "templates" / "unit.j2").write_text("x")
    assert find_root(cwd=root / "playbooks") == root             # root's own, under the sticky /tmp: fine
    os.chown(root / "templates" / "unit.j2", nobody, -1)
    with pytest.raises(UserError, match=r"unit.j2 belongs to uid \d+, not root: refusing"):
        find_root(cwd=root)
    os.chown(root / "templates" / "unit.j2", 0, -1)
    (root / "playbooks" / "ddtree").chmod(0o775)
    with pytest.raises(UserError, match=r"playbooks/ddtree is writable by group or others \(mode 0775\)"):
        find_root(root)
    (root / "playbooks" / "ddtree").chmod(0o755)
    tmp_path.chmod(0o777)                                        # a folder above, writable by all, not sticky
    try:
        r = CliRunner().invoke(main, ["--root", str(root), "status"])
        assert r.exit_code == 2 and f"{tmp_path} is writable by group or others (mode 0777)" in r.output, r.output
        assert "Traceback" not in r.output
    finally:
        tmp_path.chmod(0o700)


# kernels build --on HOST: the ABI a host reports is checked, and checked against its torch facts -----
FORGING_PYTHON = """#!{python}
import json, os, sys
if any("done(library=lib" in a for a in sys.argv[1:]):       # the build program: forge its report
    scratch = sys.argv[sys.argv.index("-c") + 2]
    library = os.path.join(scratch, "tree_mask.so")
    open(library, "wb").write(b"not really a library")
    print(json.dumps({{"library": library, "abi": dict(json.load(open({forged!r})))}}))
    sys.exit(0)
os.execv({python!r}, [{python!r}, *sys.argv[1:]])              # the torch and gpu facts: the real ones
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="need root (the build runs in the root-only /var/lib/fleetspec/run)")
def test_a_host_cannot_publish_a_kernel_under_a_forged_or_traversing_abi(tmp_path, sshd, ssh_client_key,
                                                                          inventory_writer):
    """The reported python_tag/torch/cuda/arch_list became cache path parts unchecked (a folder
    outside the cache written, an existing one removed) and were never compared with the torch
    facts of the same host."""
    import subprocess

    pytest.importorskip("torch")
    import torch

    from fleetspec.model import kernel as K

    root, cache = tmp_path / "fleet", tmp_path / "cache" / "kernels"
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir(parents=True)
    forged, python = tmp_path / "forged.json", tmp_path / "python"
    python.write_text(FORGING_PYTHON.format(python=sys.executable, forged=str(forged)))
    python.chmod(0o755)
    inventory_writer(root / "inventory" / "lab.yaml", {"h1": sshd}, ssh_client_key,
                     host_vars={"h1": f"{{python: {python}}}"})
    honest = {"python_tag": "cp%d%d" % sys.version_info[:2], "torch": torch.__version__, "cuda": "cpu",
              "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI), "platform": "linux_x86_64", "arch_list": []}
    source = ROOT / "playbooks/ddtree/kernels/tree_mask"
    spec = K.load_spec(source)
    bad_torch = honest["torch"] + "/../../../victim"
    victim = Path(os.path.realpath(cache / K.cache_key(spec, K.Abi(**{**honest, "torch": bad_torch}))))
    victim.mkdir(parents=True)
    (victim / "keep").write_text("an existing folder")

    def build(**tags):
        forged.write_text(json.dumps({**honest, **tags}))
        return subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(root), "kernels", "build",
                               str(source), "--on", "h1", "--cache", str(cache)],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)

    for tags, said in (({"torch": bad_torch}, "is not a torch tag"),
                       ({"python_tag": "cp311/../x"}, "python_tag 'cp311/../x' is not a python_tag tag"),
                       ({"cuda": "12.4", "arch_list": ["9.0"]}, "reported cuda '12.4', but the host's torch facts "
                                                                 "say 'cpu'"),
                       ({"torch": "2.99.0+cpu"}, "reported torch '2.99.0+cpu'")):
        r = build(**tags)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert said in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert (victim / "keep").read_text() == "an existing folder"
    assert not cache.exists() or not any(cache.iterdir())
    r = build()                                           # the honest report is recorded, under the host's ABI
    assert r.returncode == 0, r.stderr
    assert [p.name for p in cache.iterdir()] == [K.cache_key(spec, K.Abi(**{**honest, "arch_list": ()}))]


# The controller's mirror: keyed by host identity, and checked before a repair ----------------------
def test_the_mirror_is_keyed_by_host_and_a_repair_needs_the_machine_it_was_taken_from(
        tmp_path, sshd, sshd_factory, ssh_client_key, inventory_writer):
    """lab.yaml and example-production.yaml both mirrored ct129 to .fleetspec/hosts/ct129/<svc>/,
    and a repair compared only the service: a rollback could write another machine's unit file."""
    import time as _time

    from fleetspec.errors import NeedsAttention
    from fleetspec.model.inventory import load_inventory
    from fleetspec.model.layout import local_mirror
    from fleetspec.remote.transport import Transport

    other = sshd_factory()                                   # another machine: its own host key
    a = load_inventory(inventory_writer(tmp_path / "a.yaml", {"ct129": sshd}, ssh_client_key,
                                        known_hosts=tmp_path / "kh_a")).hosts["ct129"]
    b = load_inventory(inventory_writer(tmp_path / "b.yaml", {"ct129": other}, ssh_client_key,
                                        known_hosts=tmp_path / "kh_b")).hosts["ct129"]
    fleet = tmp_path / "fleet"
    assert local_mirror(fleet, a, SERVICE) != local_mirror(fleet, b, SERVICE)
    unit = b"[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server\n"
    baseline = Baseline(service=SERVICE, unit_path=f"/etc/systemd/system/{SERVICE}", unit_bytes=unit, dropins={},
                        exec_argv=[], environment={}, sglang={}, served_algorithm=None, declared_algorithm=None,
                        taken_at=_time.time(), modes={f"/etc/systemd/system/{SERVICE}": 0o644})
    mirror = local_mirror(fleet, a, SERVICE)
    ta, tb = Transport(a), Transport(b)
    try:
        HostState(ta, "ct129", SERVICE, mirror=mirror, root=tmp_path / "state-a").write_baseline(baseline)
        assert json.loads((mirror / "identity.json").read_text())["host_key"] == ta.host_key()
        assert mode(mirror / "identity.json") == 0o600
        # the machine behind b's name answers at a's folder (same name and address, reinstalled or swapped)
        swapped = HostState(tb, "ct129", SERVICE, mirror=mirror, root=tmp_path / "state-b")
        with pytest.raises(NeedsAttention, match=r"taken from host key SHA256:\S+, this host shows SHA256:\S+: it may "
                                                 r"be another machine's"):
            swapped.baseline_from_text("{torn", repair=True)
        assert not (tmp_path / "state-b").exists()              # nothing written on the other machine
        same = HostState(ta, "ct129", SERVICE, mirror=mirror, root=tmp_path / "state-a")
        assert same.baseline_from_text("{torn", repair=True).unit_bytes == unit and same.repaired
    finally:
        ta.close()
        tb.close()


# The controller id can be copied: a pid is judged only on its own machine and boot, never against a live session
@pytest.fixture
def quick_beats(monkeypatch):
    monkeypatch.setenv("FLEETSPEC_LOCK_HEARTBEAT_S", "0.2")


def _dead_pid() -> int:
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("where", ["a clone (same id, other machine or boot)", "this machine, session alive"])
def test_a_live_holder_with_a_copied_controller_id_is_never_ended(t, tmp_path, monkeypatch, quick_beats, where):
    """A clone of the controller (same id file) judged a live holder on another machine dead by
    its pid and ended its lock without --force."""
    import secrets
    import socket
    import time as _time

    from fleetspec.errors import UserError
    from fleetspec.identity import ENV, machine_boot
    from fleetspec.remote.lock import RemoteLock, busy, is_held
    from fleetspec.remote.lock_holder import Holder, read_holder
    from tests.unit.test_lock import backdate_heartbeat, until_beat

    monkeypatch.setenv(ENV, "controller-copied-id")
    boot = "0123456789abcdef" if where.startswith("a clone") else machine_boot()
    lock = str(tmp_path / "lock")
    holder = Holder(who="ops", machine=socket.gethostname(), pid=_dead_pid(), since=_time.time(), release="r-live",
                    controller="controller-copied-id", token=secrets.token_hex(16), boot=boot)
    live = RemoteLock(t, lock, release="r-live", holder=holder).__enter__()     # beats: its session is alive
    try:
        until_beat(lock, holder, backdate_heartbeat(lock, holder))              # a heartbeat has come
        assert isinstance(busy(t, lock), UserError)
        with pytest.raises(UserError, match=r"is held by ops .*fleetspec unlock h --force"):
            RemoteLock(t, lock, release="r-second").__enter__()
        assert is_held(t, lock) and read_holder(t, lock).token == holder.token
        live.stop_heartbeat()                      # its session goes quiet: this controller may now end it,
        if where.startswith("a clone"):            # unless the pid is another machine's: --force is for that
            with pytest.raises(UserError, match="is held by ops"):
                RemoteLock(t, lock, release="r-second").__enter__()
        else:
            with RemoteLock(t, lock, release="r-second") as mine:
                assert read_holder(t, lock).token == mine.holder.token
    finally:
        live.__exit__(None, None, None)


# The host's python runs as root only from a tree only root can change --------------------------------
@pytest.fixture
def user_venv(tmp_path):
    """A venv that `nobody` owns (as when the service's own User= pip-installed sglang), in a folder
    it can reach, with a .pth that `nobody` itself planted: it would run at every interpreter start."""
    import shutil
    import subprocess

    if shutil.which("runuser") is None or os.geteuid() != 0:
        pytest.skip("need root and runuser")
    top = Path(f"/tmp/fleetspec-sec-{os.getpid()}")
    top.mkdir(mode=0o755)
    try:
        venv = top / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        subprocess.run(["chown", "-R", "nobody", str(venv)], check=True)
        site = next(venv.glob("lib/python3*/site-packages"))
        pth = f"import os; open({str(top / 'ran-as')!r}, 'a').write(str(os.getuid()) + chr(10))"
        r = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", f"printf '%s\\n' {shlex.quote(pth)} > {site}/zz.pth"],
                           capture_output=True, text=True)
        assert r.returncode == 0 and (site / "zz.pth").stat().st_uid != 0, r.stderr
        yield SimpleNamespace(python=str(venv / "bin" / "python3"), ran=top / "ran-as", top=top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_venv_others_can_write_is_never_run_as_root(t, user_venv, tmp_path):
    """Its .pth ran as root at the next `fleetspec status` (sglang and torch facts), smoke run,
    stage program and kernel build."""
    from fleetspec.remote import facts, files
    from fleetspec.remote.facts import sglang as sglang_fact
    from fleetspec.remote.facts import torch as torch_fact

    for fact in (sglang_fact, torch_fact):
        with pytest.raises(facts.FactError, match=r"^h: \S+/venv/bin/python3 runs as root, but \S+/venv can be changed "
                                                  r"by others \(owner uid \d+, mode 755\): refusing to run it"):
            facts.gather(t, fact, python=user_venv.python)
    r = files.run_python(t, user_venv.python, "print('ran')", rundir=str(tmp_path / "run"))
    assert r.rc == files.UNTRUSTED_RC and "ran" not in r.stdout and files.UNTRUSTED in r.stderr
    r = files.run_python_from_root(t, user_venv.python, "print('ran')")
    assert r.rc == files.UNTRUSTED_RC and "ran" not in r.stdout
    assert not user_venv.ran.exists(), user_venv.ran.read_text()       # the planted .pth never ran (as anyone)
    os.system(f"chown -R root {user_venv.top}/venv")                     # the same venv, root's: runs
    r = files.run_python(t, user_venv.python, "print('ran')", rundir=str(tmp_path / "run"))
    assert r.rc == 0 and r.stdout.strip() == "ran" and set(user_venv.ran.read_text().split()) == {"0"}
    (user_venv.top / "venv").chmod(0o775)                               # group-writable: refused again
    r = files.run_python(t, user_venv.python, "print('again')", rundir=str(tmp_path / "run"))
    assert r.rc == files.UNTRUSTED_RC and "mode 775" in r.stderr


def test_an_in_place_copy_never_writes_through_a_link_planted_at_its_temp_name(t, tmp_path):
    """The copy into site-packages went to the fixed name `<file>.fleetspec-tmp`: a link planted
    there sent root's write to any file."""
    from fleetspec.remote import files

    site, victim = tmp_path / "site", tmp_path / "victim"
    site.mkdir()
    victim.write_text("precious\n")
    (site / "spec_info.py").write_text("old\n")
    (site / "spec_info.py.fleetspec-tmp").symlink_to(victim)
    (tmp_path / "new.py").write_text("new\n")
    t.run_script(files.copy_atomic(str(tmp_path / "new.py"), str(site / "spec_info.py")), timeout=30, check=True)
    assert victim.read_text() == "precious\n" and (site / "spec_info.py").read_text() == "new\n"
    assert sorted(p.name for p in site.iterdir()) == ["spec_info.py", "spec_info.py.fleetspec-tmp"]


# Probes count only answers from the unit's own processes ---------------------------------------------
SQUATTER = r'''
import ctypes, http.server, json, sys
ctypes.CDLL(None).prctl(15, b"\x1b]52;c;cA==\x07", 0, 0, 0)       # comm: the user's own text
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"speculative_algorithm": "DDTREE"}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
'''


@pytest.fixture
def squatter():
    import shutil
    import subprocess

    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed")
    p = subprocess.Popen([sys.executable, "-c", SQUATTER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        yield SimpleNamespace(pid=p.pid, port=port,
                              cgroup=[ln.split(":", 2)[2] for ln in Path(f"/proc/{p.pid}/cgroup").read_text().splitlines()])
    finally:
        p.kill()
        p.wait()


def test_an_answer_counts_only_from_a_listener_in_the_units_cgroup(t, squatter, tmp_path):
    """Whoever bound the API port first answered /ready, /health, /server_info and /generate, and
    the release was committed healthy. The unit's ControlGroup comes from a stand-in systemctl
    (this machine runs no systemd); ss, the pid and /proc/<pid>/cgroup are the real ones."""
    from fleetspec.remote.facts import listener

    shim = tmp_path / "bin"
    shim.mkdir()

    def owner(unit_cgroup: str):
        (shim / "systemctl").write_text(f"#!/bin/sh\necho {shlex.quote(unit_cgroup)}\n")
        (shim / "systemctl").chmod(0o755)
        r = t.run_script(f"PATH={shim}:$PATH; " + listener.command(SERVICE, squatter.port), timeout=30, check=True)
        return listener.parse(r.stdout, SERVICE, squatter.port)

    other = owner("/system.slice/sglang-test.service")
    assert not other.ok and [p.pid for p in other.foreign()] == [squatter.pid]
    assert other.reason() == (f"port {squatter.port} is held by pid {squatter.pid} (\x1b]52;c;cA==\x07), not by a "
                              f"process of {SERVICE} (cgroup /system.slice/sglang-test.service): its answers are "
                              f"not the service's")
    own = max(squatter.cgroup, key=len)                    # the listener's own cgroup as the unit's: it counts
    assert owner(own).ok and owner(own).reason() == ""
    assert owner(own.rstrip("/") + "-other").foreign()     # a sibling whose name merely starts alike does not
    assert not owner("").ok and "which is not running" in owner("").reason()
    free = listener.parse("cgroup /system.slice/x.service\n", SERVICE, 1)
    assert not free.ok and free.reason() == "nothing listens on port 1"
    assert "`ss` (iproute2) is not on the host" in listener.parse(listener.NO_SS, SERVICE, 1).reason()


def test_the_readiness_probe_asks_who_listens_before_it_counts_an_answer(t, squatter):
    """probes._wait checks the listener once /ready answered (the lab test drives it on a real unit)."""
    import inspect

    from fleetspec.ops import probes

    said = probes.listener_problem(t, SERVICE, squatter.port)      # no systemd here: nothing is known to be its own
    assert said == f"cannot tell who listens on port {squatter.port}: systemctl is not on the host"
    src = inspect.getsource(probes._wait)
    assert src.index("listener_problem(") < src.index("_after_ready(")
