"""Rollout records on the controller: `<fleet root>/.fleetspec/rollouts/<id>.json`, beside the
ledger mirrors, so a paused rollout outlives the process that paused it.

Each record is rewritten whole, atomically (temp file, fsync, rename), after every batch. A
process that runs a rollout (deploy, promote, abort) holds an flock on `<id>.lock` for as long as
it runs: a second promote of the same rollout is refused at once, and a record left `running`
with its lock free was cut off (the lock dies with its process).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from fleetspec.errors import ConfigError, FleetspecError, UserError
from fleetspec.model.ledger import actor
from fleetspec.model.rollout import HostRun, Record, is_rollout_id, new_rollout_id, pauses_after
from fleetspec.ops.hoststate import write_private


def folder(root: Path) -> Path:
    return Path(root) / ".fleetspec" / "rollouts"


def record_path(root: Path, rid: str) -> Path:
    if not is_rollout_id(rid):                 # it becomes a path part
        raise UserError(f"{rid!r} is not a rollout id (like 20261205-001526-3af1; see fleetspec rollouts)")
    return folder(root) / f"{rid}.json"


def save(root: Path, record: Record) -> None:
    write_private(record_path(root, record.id), (json.dumps(record.to_json(), indent=1, sort_keys=True)
                                                 + "\n").encode())


def load(root: Path, rid: str) -> Record:
    path = record_path(root, rid)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"no rollout {rid} under {folder(root)} (see fleetspec rollouts)") from None
    try:
        return Record.from_json(json.loads(text), str(path))
    except ValueError as err:
        raise ConfigError(path, None, f"not a rollout record: {str(err).removeprefix(str(path) + ': ')}") from None


def all_records(root: Path) -> tuple[list[Record], list[str]]:
    """Every record, oldest first, and a line for each file that does not read as one."""
    out, bad = [], []
    for path in sorted(folder(root).glob("*.json")) if folder(root).is_dir() else []:
        try:
            out.append(load(root, path.stem))
        except FleetspecError as err:
            bad.append(str(err))
    return out, bad


def find(root: Path, wanted: str) -> str:
    """A rollout id from the id itself or a unique start or end of it (its 4 random hex digits)."""
    if is_rollout_id(wanted):
        return wanted
    ids = sorted(p.stem for p in folder(root).glob("*.json")) if folder(root).is_dir() else []
    hits = [i for i in ids if wanted and (i.startswith(wanted) or i.endswith(wanted))]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise UserError(f"rollout {wanted!r} is ambiguous: {', '.join(hits[-5:])}")
    raise UserError(f"no rollout {wanted!r} (latest: {', '.join(ids[-3:]) or 'none'}; see fleetspec rollouts)")


@contextmanager
def held(root: Path, rid: str, what: str) -> Iterator[None]:
    """The rollout's lock for this process, or UserError naming it (never waits)."""
    path = record_path(root, rid).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"rollout {rid} is held by another fleetspec process (a deploy, promote or abort of "
                            f"it runs); {what} waits for it to end") from None
        yield
    finally:
        os.close(fd)                           # closing the last descriptor drops the flock


def create(root: Path, record: Record) -> Record:
    """Give `record` a new id no other record has (created exclusively) and write it."""
    folder(root).mkdir(parents=True, exist_ok=True, mode=0o700)
    for _ in range(50):
        rid = new_rollout_id()
        try:
            os.close(os.open(record_path(root, rid), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        except FileExistsError:
            continue
        record.id = rid
        save(root, record)
        return record
    raise UserError(f"could not find a free rollout id under {folder(root)}")


def new_record(kind: str, batches: list[list[str]], command: list[str], **fields) -> Record:
    return Record(id="00000000-000000-0000", kind=kind, by=actor(), command=list(command), created=time.time(),
                  batches=[list(b) for b in batches], **fields)


@dataclass
class Control:
    """What ops.fleet.deploy_fleet asks of a rollout: its batches (host objects, by name), where
    to start and stop, and a place to write each batch's outcomes (the record, saved at once)."""
    root: Path
    record: Record
    began: dict[int, float] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def start(self) -> int:
        return self.record.next_batch

    @property
    def failures(self) -> int:
        return self.record.failures

    def batches_of(self, hosts) -> list[list]:
        by_name = {h.name: h for h in hosts}
        return [[by_name[n] for n in batch] for batch in self.record.batches]

    def pauses_after(self, number: int, total: int) -> bool:
        return pauses_after(self.record.pause_after, number, total, bool(self.record.strategy.get("canary")))

    def batch_started(self, number: int) -> None:
        self.began[number] = time.time()

    def batch_done(self, number: int, outcomes, failures: int) -> None:
        now = time.time()
        for o in outcomes:
            self.record.hosts[o.host] = host_run(o, number, self.began.get(number, now), now)
        self.record.next_batch, self.record.failures = number + 1, failures
        save(self.root, self.record)


    def rollback_batch_done(self, number: int, rows: list[dict], failures: int) -> None:
        now = time.time()
        for r in rows:
            self.record.hosts[r["host"]] = HostRun(
                status=str(r["status"]), batch=number, release=r.get("target"), previous=r.get("left") or "baseline",
                started=self.began.get(number, now), ended=now, seconds=float(r.get("seconds") or 0.0),
                reason=str(r.get("reason") or r.get("note") or "")[:500], exit_code=int(r.get("exit_code") or 0))
        self.record.next_batch, self.record.failures = number + 1, failures
        save(self.root, self.record)


def run_rollback(root: Path, record: Record, hosts, to, *, connect, echo, progress, on_error, seats, strategy):
    """A fleet rollback as a rollout: its record written after each batch, its id in each line."""
    from fleetspec.ops.fleet import rollback_fleet

    with held(root, record.id, "this rollback"):
        rows, code = rollback_fleet(hosts, to, connect=connect, root=root, echo=echo, progress=progress,
                                    on_error=on_error, seats=seats, strategy=strategy, rollout=Control(root, record))
        for r in rows:
            if r["status"] == "skipped":
                record.hosts[r["host"]] = HostRun(status="skipped", reason=r["reason"], exit_code=1)
        record.state = "failed" if code else "done"
        record.note(record.state, actor())
        save(root, record)
    return rows, code


def host_run(o, batch: int, started: float, ended: float) -> HostRun:
    """A DeployOutcome (or a rollback row) as the record keeps it: no plan, no journal."""
    return HostRun(status=str(o.status), batch=batch, release=o.release, previous=o.previous, started=started,
                   ended=ended, seconds=round(o.seconds, 2), failed_step=o.failed_step, reason=o.reason[:500],
                   figures=o.figures, exit_code=o.exit_code)


def finish(root: Path, record: Record, outcomes, paused: bool) -> None:
    """The record's state once its process ends (paused, done or failed), the outcomes of the
    hosts no batch ran (skipped) kept too."""
    for o in outcomes:
        known = record.hosts.get(o.host)
        if known is None or known.status == "pending":
            record.hosts[o.host] = host_run(o, record.next_batch, time.time(), time.time())
        else:                                  # --rollback-all-on-abort changed it after its batch
            known.status, known.reason, known.exit_code = str(o.status), o.reason[:500], o.exit_code
    bad = any(r.exit_code for r in record.hosts.values())
    record.state = "paused" if paused else "failed" if bad else "done"
    record.note(f"paused after batch {record.next_batch}" if paused else record.state, actor())
    save(root, record)


def moved_since(root: Path, record: Record, host: str) -> str | None:
    """A later rollout that moved `host` after `record` did (abort must not undo it): its id."""
    records, _ = all_records(root)
    for other in records:
        if other.id > record.id and other.hosts.get(host, HostRun()).status in ("healthy", "rolled_back"):
            return other.id
    return None


def run_deploy(root: Path, record: Record, hosts, playbook, *, connect, options, strategy, echo, progress,
               seats=None, mode="release", run_gates=True, allow_unhealthy=False, pause_at=None) -> list:
    """Run the rollout's batches from its first not run yet, under its lock, to the end or to its
    next pause; the record says which (state paused | done | failed). Returns this run's outcomes."""
    with held(root, record.id, "this deploy"):
        return _run_held(root, record, hosts, playbook, connect=connect, options=options, strategy=strategy,
                         echo=echo, progress=progress, seats=seats, mode=mode, run_gates=run_gates,
                         allow_unhealthy=allow_unhealthy, pause_at=pause_at)


def _run_held(root: Path, record: Record, hosts, playbook, *, connect, options, strategy, echo, progress, seats,
              mode, run_gates, allow_unhealthy, pause_at) -> list:
    from fleetspec.ops.fleet import deploy_fleet

    was = record.state
    record.state = "running"
    save(root, record)
    try:
        outcomes = deploy_fleet(hosts, playbook, connect=connect, root=root, options=options, strategy=strategy,
                                run_gates=run_gates, echo=echo, progress=progress, pause_at=pause_at, mode=mode,
                                allow_unhealthy=allow_unhealthy, seats=seats, rollout=Control(root, record))
    except FleetspecError as err:               # refused before any host (min_serving): nothing changed
        record.state = "failed" if record.next_batch == 0 else was
        record.note(f"refused: {err}", actor())
        save(root, record)
        raise
    if strategy.rollback_all_on_abort and record.failures > strategy.max_fail:
        _put_back_earlier(root, record, hosts, {o.host for o in outcomes}, connect=connect, echo=echo,
                          progress=progress, seats=seats or {})
    finish(root, record, outcomes, paused=any(str(o.status) == "pending" for o in outcomes))
    return outcomes


def _put_back_earlier(root: Path, record: Record, hosts, ran_here: set, **how) -> None:
    """--rollback-all-on-abort across a pause: the hosts earlier processes of this rollout moved
    (this process's own were put back by deploy_fleet) go back too."""
    ran = {h for batch in record.batches[:record.next_batch] for h in batch} - ran_here
    earlier = [h for h in hosts if h.name in ran and record.hosts.get(h.name, HostRun()).status == "healthy"]
    if earlier:
        record.note(f"rollback-all-on-abort: {', '.join(h.name for h in earlier)}", actor())
        put_back(root, record, earlier, why="rolled back: the rollout was aborted", **how)


def promotable(record: Record) -> None:
    """UserError unless the rollout waits at a pause."""
    if record.kind != "deploy" or record.state != "paused":
        what = {"running": "runs now, or was cut off (fleetspec abort " + record.id + " puts its hosts back)",
                "done": "is done: every host went", "failed": "stopped on failures",
                "aborted": "was aborted"}.get(record.state, record.state)
        raise UserError(f"rollout {record.id} {what}; only a paused deploy can be promoted")


def check_playbook(record: Record, playbook) -> None:
    """The playbook file must be the one the rollout began with: a promote goes on with the same."""
    import hashlib

    digest = hashlib.sha256(Path(playbook.path).read_bytes()).hexdigest()
    if record.playbook_sha256 and digest != record.playbook_sha256:
        raise UserError(f"{playbook.path} changed since rollout {record.id} began (sha256 {digest[:12]}, was "
                        f"{record.playbook_sha256[:12]}): abort it and deploy again, or put the playbook back")


def abort(root: Path, rid: str, *, select, connect, echo, progress, seats_of=lambda hosts: {}) -> tuple[list, int]:
    """Put back every host the rollout left on its release, each to what it ran before the
    rollout; a host a later rollout moved since stays (its row says which). Records it."""
    with held(root, rid, "abort"):
        record = load(root, rid)
        if record.kind != "deploy" or record.state == "aborted":
            raise UserError(f"rollout {rid} is {'a rollback' if record.kind != 'deploy' else 'aborted already'}: "
                            "nothing to abort")
        names = record.changed()
        hosts = select(names) if names else []
        record.note("abort", actor())
        rows, code = put_back(root, record, hosts, connect=connect, echo=echo, progress=progress,
                              seats=seats_of(hosts) if hosts else {}, why="aborted")
        if any(r["status"] == "error" for r in rows):
            record.note("abort incomplete: run fleetspec abort again once the hosts in error are fixed", actor())
        else:
            record.state, record.pause_after = "aborted", None
        save(root, record)
    return rows, code


def put_back(root: Path, record: Record, hosts, *, connect, echo, progress, seats, why: str) -> tuple[list, int]:
    """Each of `hosts` back to what it ran before `record` (its previous release or its
    baseline), one at a time, the record saved after each; a host a later rollout moved since
    is left as it is (exit 3: the operator decides)."""
    from fleetspec.model.release import BASELINE
    from fleetspec.ops.rollback import rollback

    rows, code = [], 0
    for h in hosts:
        run = record.hosts[h.name]
        later = moved_since(root, record, h.name)
        if later:
            rows.append({"host": h.name, "status": "left", "reason": f"moved since by rollout {later}", "exit_code": 3})
            code = max(code, 3)
            continue
        back = None if run.previous in (None, BASELINE) else run.previous
        try:
            out = rollback(connect(h), h, root, back, echo=echo, progress=progress, seat=seats.get(h.name),
                           rollout=record.id)
        except FleetspecError as err:
            rows.append({"host": h.name, "status": "error", "reason": str(err), "exit_code": err.exit_code})
            code = max(code, err.exit_code)
            run.reason = f"{why}: {err}"[:500]
            continue
        rows.append(out.to_json())
        run.status, run.reason = "rolled_back", f"{why}: back to {back or BASELINE}"
        run.exit_code = 1 if why != "aborted" else 0
        save(root, record)
    return rows, code


def promote(root: Path, rid: str, *, select, connect, echo, progress, seats_of=lambda hosts: {},
            pause_at=None) -> tuple[Record, list]:
    """Go on with a paused rollout from any shell: the same batches, max-fail budget (and the
    failures so far), playbook, options and pause points, all read from its record."""
    from fleetspec.model.overrides import parse_overrides
    from fleetspec.model.playbook import load_playbook_for
    from fleetspec.ops.fleet import Strategy

    with held(root, rid, "this promote"):
        record = load(root, rid)
        promotable(record)
        hosts = select(record.host_order())
        playbook = load_playbook_for(root, record.algo or "")
        check_playbook(record, playbook)
        if record.waive_gpu:
            import dataclasses

            playbook = dataclasses.replace(playbook, gpu_waive=tuple(dict.fromkeys([*playbook.gpu_waive,
                                                                                     *record.waive_gpu])))
        options = parse_overrides(playbook, record.sets)
        strategy = Strategy(**{k: v for k, v in record.strategy.items() if k in Strategy.__dataclass_fields__})
        record.note(f"promoted from batch {record.next_batch + 1}", actor())
        outcomes = _run_held(root, record, hosts, playbook, connect=connect, options=options, strategy=strategy,
                             echo=echo, progress=progress, seats=seats_of(hosts), mode=record.mode,
                             run_gates=record.run_gates, allow_unhealthy=record.allow_unhealthy, pause_at=pause_at)
    return record, outcomes
