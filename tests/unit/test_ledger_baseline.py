"""The ledger never crashes on torn lines; the baseline round-trips and checks its own hashes."""

from __future__ import annotations

import json

import pytest

from fleetspec.model import ledger as L
from fleetspec.model.baseline import Baseline


def test_ledger_round_trip_and_statuses():
    entries = [L.Entry.step("r1", "preflight", "started"), L.Entry.status("r1", L.SWITCHED),
               L.Entry.status("r1", L.HEALTHY), L.Entry.step("r2", "stage", "started")]
    parsed = L.parse(L.render(entries))
    assert list(parsed.entries) == entries and parsed.skipped == ()
    assert parsed.releases() == {"r1": L.HEALTHY, "r2": L.STARTED}
    assert parsed.interrupted() == ["r2"]
    assert parsed.last_step("r2").name == "stage"


def test_torn_and_foreign_lines_are_skipped_and_counted():
    good = L.Entry.status("r1", L.HEALTHY).to_line()
    torn = good[: len(good) // 2]
    text = "\n".join([good, torn, "not json", json.dumps({"kind": "step"}), "", good]) + "\n"
    parsed = L.parse(text)
    assert len(parsed.entries) == 2
    assert parsed.skipped == (2, 3, 4)


def test_gate_figures_are_merged_per_release():
    entries = [L.Entry.step("r1", "gates", "ok", figures={"acceptance": {"accept_length": 3.1}}),
               L.Entry.step("r2", "gates", "ok", figures={"parity": {"prompts_compared": 8}})]
    assert L.parse(L.render(entries)).figures("r1") == {"acceptance": {"accept_length": 3.1}}


def test_entry_lines_have_no_newlines_even_with_hostile_detail():
    line = L.Entry.step("r", "x", "failed", reason="a\nb\r\n\x00c").to_line()
    assert "\n" not in line and json.loads(line)["detail"]["reason"] == "a\nb\r\n\x00c"


def _baseline(**kw) -> Baseline:
    args = dict(service="sglang-qwen.service", unit_path="/etc/systemd/system/sglang-qwen.service",
                unit_bytes=b"[Service]\nExecStart=/bin/true %% $$HOME\n",
                dropins={"/etc/systemd/system/sglang-qwen.service.d/10-env.conf": b"[Service]\nEnvironment=A=1\n"},
                exec_argv=["/bin/true", "%", "$HOME"], environment={"A": "1"}, sglang={"version": "0.5.13.post1"},
                served_algorithm="EAGLE", declared_algorithm="NEXTN")
    args.update(kw)
    return Baseline(**args)


def test_baseline_round_trip_is_byte_exact():
    b = _baseline(unit_bytes=bytes(range(256)))
    assert Baseline.from_json(b.to_json()) == b


def test_baseline_refuses_a_tampered_record():
    raw = json.loads(_baseline().to_json())
    raw["unit_sha256"] = "0" * 64
    with pytest.raises(ValueError, match="sha256"):
        Baseline.from_json(json.dumps(raw))


def test_baseline_differences_name_what_changed():
    b = _baseline()
    assert b.differences(b.unit_bytes, b.dropins) == []
    changed = b.differences(b.unit_bytes + b"# edited\n", {})
    assert any("sglang-qwen.service changed" in c for c in changed)
    assert any("10-env.conf removed" in c for c in changed)
