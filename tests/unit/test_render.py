"""systemd escaping: every argv survives exec_line -> systemd's own word splitting -> exec."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetspec.render import environment
from fleetspec.systemd_unit import environment_line, exec_line, exec_start_of, expand_dollars, parse_exec, systemd_quote

# Any text but NUL and surrogates (which cannot be written as UTF-8).
words = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
tricky = st.text(alphabet=list(" \t\n\r\"'\\;%$a{}@-x\x01\x7f\x85\u2028\x0b\x0cé"), max_size=12)


def _roundtrip(argv):
    line = exec_line(argv)
    [cmd] = parse_exec(line)
    got, uses_vars = expand_dollars(cmd.argv)
    assert not uses_vars
    return got


@settings(max_examples=300, deadline=None)
@given(st.lists(words | tricky, max_size=8))
def test_systemd_quote_roundtrips_through_execstart_parser(args):
    argv = ["/usr/bin/python3", *args]
    assert _roundtrip(argv) == argv


@settings(max_examples=100, deadline=None)
@given(st.lists(words | tricky, max_size=5))
def test_roundtrip_through_unit_file_with_dropin_reset(args):
    argv = ["/usr/bin/python3", *args]
    unit = "[Unit]\nDescription=x\n\n[Service]\nExecStart=/bin/false old\n"
    dropin = f"[Service]\nExecStart=\nExecStart={exec_line(argv)}\n"
    [cmd] = exec_start_of([unit, dropin])
    assert expand_dollars(cmd.argv)[0] == argv


@pytest.mark.parametrize("arg,quoted", [
    ("plain", "plain"),
    ("--port", "--port"),
    ("50%", "50%%"),
    ("$HOME", "$$HOME"),
    ("a b", '"a b"'),
    ("", '""'),
    ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'),
    ("line\nbreak", '"line\\nbreak"'),
    ("bell\x07", '"bell\\a"'),
    ("esc\x1b", '"esc\\x1b"'),
    (";", '";"'),
    ("it's", "\"it's\""),
])
def test_systemd_quote_examples(arg, quoted):
    assert systemd_quote(arg) == quoted


def test_exec_line_refuses_prefix_and_nul():
    with pytest.raises(ValueError):
        exec_line(["-/bin/x"])
    with pytest.raises(ValueError):
        systemd_quote("a\x00b")


def test_environment_line():
    assert environment_line("PYTHONPATH", "/var/lib/fleetspec/x/current/overlay") == \
        "Environment=PYTHONPATH=/var/lib/fleetspec/x/current/overlay"
    assert environment_line("A", "x y%") == 'Environment="A=x y%%"'
    with pytest.raises(ValueError):
        environment_line("1A", "x")


def test_template_environment_is_strict(tmp_path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "dropin.conf.j2").write_text(
        "[Service]\nExecStart=\nExecStart={{ argv | exec_line }}\n{{ environment_line('A', a) }}\n")
    env = environment(tmp_path)
    text = env.get_template("dropin.conf.j2").render(argv=["/py", "a b"], a="1")
    assert text == '[Service]\nExecStart=\nExecStart=/py "a b"\nEnvironment=A=1\n'
    import jinja2
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing }}").render()


def test_the_environment_is_sandboxed(tmp_path):
    """A template or a playbook flag reaches its data, never Python's internals."""
    import jinja2.sandbox

    env = environment(tmp_path)
    assert isinstance(env, jinja2.sandbox.SandboxedEnvironment)
    for text in ("{{ ''.__class__.__mro__ }}", "{{ cycler.__init__.__globals__ }}", "{{ x.__dict__ }}",
                 "{{ x.__class__.__subclasses__() }}"):
        with pytest.raises((jinja2.exceptions.SecurityError, jinja2.exceptions.UndefinedError)):
            env.from_string(text).render(x=tmp_path)
    assert env.from_string("{{ d.get('a') }} {{ 'a b' | q }}").render(d={"a": 1}) == "1 'a b'"
