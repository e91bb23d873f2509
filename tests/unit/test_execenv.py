"""ExecStart's $VARIABLES expanded as systemd 252 does (facts.execenv, facts.envfile), against the
rules written in systemd's own code and manual (systemd.service(5) "Command lines", systemd.exec(5)
Environment=/EnvironmentFile=/UnsetEnvironment=). tests/lab/test_execenv_real.py runs the same
cases through a real systemd 252 and compares."""

from __future__ import annotations

import pytest

from fleetspec import systemd_unit
from fleetspec.remote.facts import env_files as env_files_fact
from fleetspec.remote.facts import execenv
from fleetspec.remote.facts.envfile import EnvFileError, parse_env_file
from fleetspec.remote.facts.execenv import HostEnv

PY = "/opt/venv/bin/python3"


def _argv(unit: str, files: dict[str, bytes] | None = None, manager: dict[str, str] | None = None,
          dropins: tuple[str, ...] = ()) -> list[str]:
    env = HostEnv(files={p: ((p, b),) if b is not None else () for p, b in (files or {}).items()},
                  manager={} if manager is None else manager)
    return list(execenv.effective_exec_command(unit, dropins, env=env).argv)


def _unit(body: str, execstart: str) -> str:
    return f"[Service]\n{body}\nExecStart={PY} -c pass {execstart}\n"


def _args(body: str, execstart: str, **kw) -> list[str]:
    return _argv(_unit(body, execstart), **kw)[3:]


# systemd.service(5), "Command lines" ------------------------------------------------------------
def test_man_page_example_one_word_splits_and_braces_do_not():
    """`Environment="ONE=one" 'TWO=two two'` / `ExecStart=echo $ONE $TWO ${TWO}`: four arguments
    "one", "two", "two", "two two"."""
    assert _args("Environment=\"ONE=one\" 'TWO=two two'", "$ONE $TWO ${TWO}") == ["one", "two", "two", "two two"]


def test_man_page_example_two_as_systemd_252_parses_it():
    """`Environment=ONE='one' "TWO='two two' too" THREE=`. The manual says ${ONE} gives `'one'`;
    systemd 252's config_parse_environ unquotes quotes inside a word (extract_first_word UNQUOTE),
    so ONE is `one` (tests/lab/test_execenv_real.py shows real systemd 252 doing so). The rest is
    as the manual says: `'two two' too`, an empty argument; then `one`, `two two`, `too`."""
    body = "Environment=ONE='one' \"TWO='two two' too\" THREE="
    assert _args(body, "${ONE} ${TWO} ${THREE}") == ["one", "'two two' too", ""]
    assert _args(body, "$ONE $TWO $THREE") == ["one", "two two", "too"]


@pytest.mark.parametrize("execstart,want", [
    ("--port=$PORT", ["--port=$PORT"]),            # $NAME inside a word: not expanded (no braces)
    ("--port=${PORT}", ["--port=30000"]),
    ("$$PORT", ["$PORT"]),                          # $$ is a literal $
    ("$${PORT}", ["${PORT}"]),
    ("a$$$${PORT}", ["a$${PORT}"]),
    ("${PORT:-1}", ["${PORT:-1}"]),                 # 252 leaves ${NAME:-…} as written here
    ("${PORT", ["${PORT"]),                          # unclosed
    ("${}x", ["x"]),                                 # empty name: empty
    ("$", []),                                       # a lone $ looks up the empty name: dropped
    ("$PORT.x", []),                                 # the whole rest of the word is the name
    ("$UNSET", []),                                  # unset as a word: dropped
    ("${UNSET}", [""]),                              # unset in braces: one empty argument
    ("x${UNSET}y", ["xy"]),
    ("$FLAGS", ["--a", "b c", "d'e", "f\\g"]),     # split on whitespace, quotes removed, \ escapes
    ("${FLAGS}", ["--a \"b c\" d\\'e f\\\\g"]),
    ("$EMPTY", []),
    ("${EMPTY}", [""]),
    ("$SPACES", []),
])
def test_replace_env_argv(execstart, want):
    body = ('Environment=PORT=30000 EMPTY= "SPACES=   "\n'
            "Environment=\"FLAGS=--a \\\"b c\\\" d\\\\'e f\\\\\\\\g\"")
    assert _args(body, execstart) == want


def test_split_value_is_relaxed():
    assert execenv.split_value(" a 'b c' \"d") == ["a", "b c", "d"]      # unbalanced quote: to the end
    assert execenv.split_value("x\\") == ["x"]                             # trailing backslash dropped
    assert execenv.split_value("'' \"\"") == ["", ""]


# Where values come from, and in which order -----------------------------------------------------------
def test_environment_files_override_environment_whatever_the_order():
    unit = _unit("EnvironmentFile=/e/a\nEnvironment=X=unit Y=unit", "${X} ${Y}")
    assert _argv(unit, {"/e/a": b"X=file\n"})[3:] == ["file", "unit"]


def test_later_files_and_later_assignments_win_and_empty_resets():
    files = {"/e/a": b"X=a\nZ=a\n", "/e/b": b"X=b\n"}
    assert _args("EnvironmentFile=/e/a\nEnvironmentFile=/e/b", "${X} ${Z}", files=files) == ["b", "a"]
    assert _args("EnvironmentFile=/e/a\nEnvironmentFile=\nEnvironmentFile=/e/b", "${X}${Z}", files=files) == ["b"]
    assert _args("Environment=X=1 X=2\nEnvironment=Y=3", "${X}${Y}") == ["23"]
    assert _args("Environment=X=1\nEnvironment=\nEnvironment=Y=3", "${X}${Y}") == ["3"]


def test_dropins_apply_in_order():
    unit = _unit("Environment=X=unit", "${X}")
    assert _argv(unit, dropins=("[Service]\nEnvironment=X=dropin\n",))[3:] == ["dropin"]


def test_unset_environment_is_applied_last():
    files = {"/e/a": b"X=1\nY=2\n"}
    body = "EnvironmentFile=/e/a\nUnsetEnvironment=X Y=3"
    assert _args(body, "${X}|${Y}", files=files) == ["|2"]        # Y=3 does not match Y=2
    assert _args("EnvironmentFile=/e/a\nUnsetEnvironment=Y=2", "${Y}", files=files) == [""]


def test_the_managers_environment_and_what_systemd_sets():
    assert _args("", "${LANG}", manager={"LANG": "C.UTF-8"}) == ["C.UTF-8"]
    assert _args("Environment=HOME=/srv", "${HOME}") == ["/srv"]   # Environment= overrides systemd's own
    for name in ("HOME", "INVOCATION_ID", "MAINPID", "RUNTIME_DIRECTORY"):
        with pytest.raises(systemd_unit.UnitSyntaxError, match=rf"\${{{name}}}, which is set by systemd"):
            _args("", "${%s}" % name)
    assert _args("UnsetEnvironment=HOME", "$HOME") == []
    with pytest.raises(systemd_unit.UnitSyntaxError, match="PassEnvironment"):
        _args("PassEnvironment=TOKEN", "$TOKEN")
    with pytest.raises(systemd_unit.UnitSyntaxError, match="ExecSearchPath"):
        _args("ExecSearchPath=/opt/bin", "${PATH}")
    with pytest.raises(systemd_unit.UnitSyntaxError, match="specifier only systemd resolves"):
        _args("Environment=NAME=%n", "${NAME}")
    with pytest.raises(systemd_unit.UnitSyntaxError, match="with '='"):
        _args("Environment=A=b=c", "${A=b}")


def test_an_unknown_manager_environment_refuses_what_the_unit_does_not_set():
    unit = _unit("Environment=SET=1", "${SET} ${OTHER}")
    env = HostEnv(files={}, manager=None)
    with pytest.raises(systemd_unit.UnitSyntaxError, match=r"\$\{OTHER\}, which is not set by the unit, and the manager"):
        execenv.effective_exec_command(unit, env=env)
    assert execenv.effective_exec_command(_unit("Environment=SET=1 OTHER=2", "${SET} ${OTHER}"),
                                           env=env).argv[3:] == ("1", "2")


def test_variables_need_the_hosts_files_and_the_colon_prefix_expands_nothing():
    with pytest.raises(systemd_unit.NeedsHostEnvironment, match=r"\$VARIABLES"):
        execenv.effective_exec_command(_unit("", "$X"))
    # no lookup that could find anything: no host read needed
    assert execenv.effective_exec_command(_unit("", "$$X $ a$b")).argv[3:] == ("$X", "a$b")
    cmd = execenv.effective_exec_command(f"[Service]\nExecStart=:{PY} -c pass $X ${{Y}} $$\n")
    assert cmd.argv[3:] == ("$X", "${Y}", "$$")
    with pytest.raises(systemd_unit.UnitSyntaxError, match="first word"):
        _argv("[Service]\nExecStart=@/bin/python3 $NAME -c pass\n")


def test_the_used_variables_say_where_their_values_came_from():
    unit = _unit("EnvironmentFile=/e/a\nEnvironment=M=/m", "--model-path ${M} $OPTS $NONE")
    env = HostEnv(files={"/e/a": (("/e/a", b"OPTS=--tp 2\n"),)}, manager={})
    cmd = execenv.effective_exec_command(unit, env=env)
    assert cmd.argv[3:] == ("--model-path", "/m", "--tp", "2")
    assert [(n, s.value, s.source) for n, s in cmd.variables] == [
        ("M", "/m", "Environment="), ("OPTS", "--tp 2", "EnvironmentFile=/e/a"), ("NONE", None, "unset")]


# EnvironmentFile= ------------------------------------------------------------------------------
@pytest.mark.parametrize("text,want", [
    (b"A=1\nB=2", {"A": "1", "B": "2"}),
    (b"# comment\n; also\n  # indented\nA=1", {"A": "1"}),
    (b"A=1 # not a comment", {"A": "1 # not a comment"}),
    (b"A = spaced  \n", {"A": "spaced"}),                        # key and trailing whitespace trimmed
    (b"A=  lead", {"A": "lead"}),
    (b"A='single \"q\" $x \\n'", {"A": 'single "q" $x \\n'}),
    (b'A="dq \\" \\\\ \\` \\$ \\n"', {"A": 'dq " \\ ` $ \\n'}),     # \ escapes only " \ ` $
    (b'A="one\\\ntwo"', {"A": "onetwo"}),                         # escaped newline removed
    (b"A=one\\\ntwo", {"A": "onetwo"}),                           # continuation
    (b"A=x\\ \n", {"A": "x "}),                                   # escaped trailing space kept
    (b"A=\"a\" 'b' c", {"A": "abc"}),                             # text after a quote joins
    (b'A=x"y"', {"A": 'x"y"'}),                                   # quotes inside a value are literal
    (b"A='open\nB=2", {"A": "open\nB=2"}),                        # unclosed quote runs to the end
    (b"NOEQUALS\nA=1", {"A": "1"}),
    (b"1BAD=x\nexport C=1\nA-B=2\nOK=3", {"OK": "3"}),            # invalid names dropped
    (b"A=1\nA=2", {"A": "2"}),
    (b"A=\r\nB=2\r\n", {"A": "", "B": "2"}),
    (b"A=1\x00B=2", {"A": "1"}),                                  # NUL ends the text
    (b"A=", {"A": ""}),
    (b"", {}),
])
def test_parse_env_file(text, want):
    assert parse_env_file(text, "/e") == want


def test_env_file_refusals_and_optional_files():
    with pytest.raises(EnvFileError, match="EnvironmentFile=/e/a: invalid UTF-8"):
        _args("EnvironmentFile=/e/a", "$X", files={"/e/a": b"X=\xff\n"})
    assert _args("EnvironmentFile=-/e/a\nEnvironment=X=kept", "$X", files={"/e/a": b"X=\xff\n"}) == ["kept"]
    with pytest.raises(EnvFileError, match="EnvironmentFile=/e/gone: no such file .*systemd would refuse"):
        _args("EnvironmentFile=/e/gone", "$X", files={"/e/gone": None})
    assert _args("EnvironmentFile=-/e/gone", "${X}", files={"/e/gone": None}) == [""]
    unreadable = HostEnv(files={"/e/d": (("/e/d", None),)}, manager={})
    with pytest.raises(EnvFileError, match="/e/d cannot be read"):
        execenv.effective_exec_command(_unit("EnvironmentFile=/e/d", "$X"), env=unreadable)
    for bad, why in (("etc/x", "not an absolute path"), ("/etc/../x", "not a normalized path"),
                     ("/etc/%i.env", "needs the unit's context")):
        with pytest.raises(systemd_unit.UnitSyntaxError, match=f"EnvironmentFile={bad}: .*{why}"):
            execenv.env_file_patterns([f"[Service]\nEnvironmentFile={bad}\n"])
    assert execenv.env_file_patterns(["[Service]\nEnvironmentFile=-//etc/./a//b/\nEnvironmentFile=/etc/*.env\n"]) \
        == ["/etc/a/b", "/etc/*.env"]


def test_a_glob_reads_every_match_in_order():
    unit = _unit("EnvironmentFile=/e/*.env", "${X} ${Y}")
    env = HostEnv(files={"/e/*.env": (("/e/a.env", b"X=a\nY=a\n"), ("/e/b.env", b"X=b\n"))}, manager={})
    assert execenv.effective_exec_command(unit, env=env).argv[3:] == ("b", "a")


# The host fact, over a real sshd and sh --------------------------------------------------------------
def test_env_files_fact_reads_paths_globs_and_misses(t, tmp_path):
    from fleetspec.remote import facts

    d = tmp_path / "env dir"
    d.mkdir()
    (d / "b.env").write_bytes(b"B=2\n")
    (d / "a.env").write_bytes(b"A='x $(touch pwned) `id`'\n\xff")
    (d / ".hidden.env").write_bytes(b"H=1\n")
    (d / "sub.env").mkdir()
    odd = d / "it's $HOME;.conf"
    odd.write_bytes(b"")
    patterns = (f"{d}/*.env", str(odd), f"{d}/none-*.env", str(d / "missing"), f"{d}/[ab].env")
    got = facts.gather(t, env_files_fact, patterns=patterns)
    assert got.files[patterns[0]] == ((f"{d}/a.env", (d / "a.env").read_bytes()), (f"{d}/b.env", b"B=2\n"),
                                      (f"{d}/sub.env", None))
    assert got.files[patterns[1]] == ((str(odd), b""),)
    assert got.files[patterns[2]] == () and got.files[patterns[3]] == ()
    assert [p for p, _ in got.files[patterns[4]]] == [f"{d}/a.env", f"{d}/b.env"]
    assert not (tmp_path / "pwned").exists()
    assert got.manager is None or isinstance(got.manager, dict)     # no system bus on this machine


def test_manager_environment_is_read_from_busctls_json():
    out = 'manager {"type":"as","data":["PATH=/usr/bin:/bin","LANG=C.UTF-8","ODD=a b\\"c"]}\n'
    assert env_files_fact.parse(out).manager == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "ODD": 'a b"c'}
    assert env_files_fact.parse("manager not json\n").manager is None


# What a deploy does with it (ops.execstart) ----------------------------------------------------------
def test_exec_command_reads_the_hosts_files_only_when_variables_are_used(t, tmp_path, seen):
    from fleetspec.ops import execstart

    env_file = tmp_path / "sglang env"
    env_file.write_bytes(b'OPTS="--tp 2 --port 30000"\nMODEL=/models/q\n')
    unit = (f"[Service]\nEnvironmentFile={env_file}\nEnvironmentFile=-/nonexistent/x\n"   # the whole value: one path
            f"ExecStart={PY} -m sglang.launch_server --model-path ${{MODEL}} $OPTS\n").encode()
    cmd = execstart.exec_command(t, unit, [], "sglang.service")
    assert cmd.argv == (PY, "-m", "sglang.launch_server", "--model-path", "/models/q", "--tp", "2", "--port", "30000")
    assert len(seen) == 1
    plain = execstart.exec_command(t, f"[Service]\nExecStart={PY} -m sglang.launch_server $$x\n".encode(), [], "sglang.service")
    assert plain.argv[-1] == "$x" and len(seen) == 1            # no variables: no host read
    env_file.write_bytes(b"MODEL=\xff\n")
    with pytest.raises(systemd_unit.UnitSyntaxError, match="invalid UTF-8"):
        execstart.exec_command(t, unit, [], "sglang.service")


def test_a_secret_in_a_variable_is_refused_and_the_rest_is_noted(tmp_path, sshd, ssh_client_key, inventory_writer):
    from fleetspec.errors import UserError
    from fleetspec.model.inventory import load_inventory
    from fleetspec.ops import execstart

    host = load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key)).hosts["h"]
    files = {"/e/a": b"SGLANG_API_KEY=sk-123\nMODEL=/m\nPORT=\n"}
    secret = execenv.effective_exec_command(_unit("EnvironmentFile=/e/a", "--api-key ${SGLANG_API_KEY}"),
                                             env=HostEnv(files={p: ((p, b),) for p, b in files.items()}, manager={}))
    with pytest.raises(UserError, match=r"h: s: ExecStart= takes \$SGLANG_API_KEY from EnvironmentFile=/e/a, which "
                                        r"holds a secret") as err:
        execstart.check_variables(secret, host, None, "h: s")
    assert "sk-123" not in str(err.value)
    fine = execenv.effective_exec_command(_unit("EnvironmentFile=/e/a", "--model-path ${MODEL} ${PORT} $NOPE"),
                                           env=HostEnv(files={p: ((p, b),) for p, b in files.items()}, manager={}))
    [note] = execstart.check_variables(fine, host, None, "h: s")
    assert "$MODEL (EnvironmentFile=/e/a), $PORT (EnvironmentFile=/e/a), $NOPE (unset: unset)" in note
    assert "/m" not in note.replace("/e/a", "")                 # names and sources, never values
    assert execstart.check_variables(systemd_unit.effective_exec_command(_unit("", "--x")), host, None, "h: s") == []


def test_simulated_acceptance_from_an_environment_file_or_the_manager_fails_the_gates_closed(t, tmp_path):
    """SGLANG_SIMULATE_ACC_* set in an EnvironmentFile= (read over a real sshd) or in the manager's
    environment is in the engine's environment as systemd builds it: the plan names it, the
    drop-in unsets it and every gate is inconclusive (Environment= lines alone missed both)."""
    from pathlib import Path

    from fleetspec.model import launch
    from fleetspec.model.playbook import load_playbook
    from fleetspec.ops import argv as argv_ops
    from fleetspec.ops import execstart
    from fleetspec.ops.flags import Flags
    from fleetspec.ops.gates import INCONCLUSIVE, PASS, Verdict, fail_closed_if_simulated

    env_file = tmp_path / "sglang.env"
    env_file.write_bytes(b"SGLANG_SIMULATE_ACC_LEN=3\nHF_HOME=/h\n")
    unit = (f"[Service]\nEnvironment=A=1\nEnvironmentFile=-{env_file}\n"
            f"ExecStart={PY} -m sglang.launch_server --model-path m --speculative-algorithm EAGLE\n").encode()
    batch = HostEnv(manager={"SGLANG_SIMULATE_ACC_DIST": "1", "LANG": "C"})     # preflight's batch read it
    env = execstart.host_environment(t, unit, [], "sglang.service", batch)
    engine = execstart.engine_environment(unit, [], "sglang.service", HostEnv(env.files, batch.manager), "h: s")
    assert engine == {"SGLANG_SIMULATE_ACC_DIST": "1", "LANG": "C", "A": "1", "SGLANG_SIMULATE_ACC_LEN": "3",
                      "HF_HOME": "/h"}
    playbook = load_playbook(Path(__file__).parents[2] / "playbooks" / "ddtree.yaml")
    form = launch.classify([PY, "-m", "sglang.launch_server", "--model-path", "m", "--speculative-algorithm", "EAGLE"],
                           path=PY)
    plan = argv_ops.plan_launch(form, launch.load_table("0.5.23"), Flags(["--speculative-algorithm", "DDTREE"]),
                                playbook, "0.5.23", engine, "h: s")
    assert set(plan.simulated) == set(plan.env_dropped) == {"SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_DIST"}
    assert [v.verdict for v in fail_closed_if_simulated([Verdict("acceptance", PASS)], plan.simulated)] == [INCONCLUSIVE]
    # a unit without EnvironmentFile= costs no round trip: the batch's reading is used as it is
    assert execstart.host_environment(t, b"[Service]\nExecStart=/bin/true\n", [], "s.service", batch) is batch
    # a required file that is gone: refused in one line (systemd would not start the engine)
    env_file.unlink()
    gone = unit.replace(b"=-/", b"=/")
    with pytest.raises(Exception, match=r"^h: s: EnvironmentFile=.*no such file"):
        execstart.engine_environment(gone, [], "sglang.service", execstart.host_environment(t, gone, [], "sglang.service"),
                                     "h: s")


@pytest.mark.parametrize("body, execstart", [
    ("SGLANG_ARGS=--api-key sk-opx-42 --tp 2", "$SGLANG_ARGS"),                 # the option and its value
    ("SGLANG_ARGS='--admin-api-key=sk-opx-42'", "$SGLANG_ARGS"),
    ("K=sk-opx-42", "--api-key ${K}"),                                          # the value alone
    ("K=sk-opx-42", "--api-k $K"),                                              # argparse's unique prefix
])
def test_a_secret_option_value_inside_a_variable_is_refused(tmp_path, sshd, ssh_client_key, inventory_writer,
                                                            body, execstart):
    """The drop-in (0644) writes the expanded command line: a secret option's value that came from a
    variable (a 0600 EnvironmentFile=) is refused as a secret-named variable is, in one line."""
    from fleetspec.errors import UserError
    from fleetspec.model.inventory import load_inventory
    from fleetspec.ops import execstart as ops_execstart

    host = load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key)).hosts["h"]
    env = HostEnv(files={"/e/a": (("/e/a", f"{body}\nMODEL=/m\n".encode()),)}, manager={})
    command = execenv.effective_exec_command(_unit("EnvironmentFile=/e/a", f"--model-path $MODEL {execstart}"), env=env)
    name = body.split("=", 1)[0]
    with pytest.raises(UserError, match=rf"^h: s: ExecStart= takes \${name} from EnvironmentFile=/e/a, which holds "
                                        r"a secret;") as err:
        ops_execstart.check_variables(command, host, None, "h: s")
    assert "sk-opx-42" not in str(err.value) and "\n" not in str(err.value)
    # a secret written in the unit itself (already in its 0644 file) with harmless variables: noted, not refused
    literal = execenv.effective_exec_command(_unit("EnvironmentFile=/e/a", "--api-key sk-opx-42 $MODEL"), env=env)
    assert ops_execstart.check_variables(literal, host, None, "h: s")
