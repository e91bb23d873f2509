"""The ledger's housekeeping on the host, as shell: removing pruned releases with their PRUNED
lines, moving old lines into the archive, and reading the archive with the ledger."""

from __future__ import annotations

from fleetspec.model.layout import HostLayout
from fleetspec.remote import files
from fleetspec.remote.api import TransportLike

PRUNED_MARK = "FLEETSPEC-PRUNED"
ROTATED_MARK = "FLEETSPEC-LEDGER-ROTATED"
ARCHIVE_END = "FLEETSPEC-LEDGER-ARCHIVE-END"   # read_with_archive: the archive printed, the ledger next


def prune_script(layout: HostLayout, lines: dict[str, str]) -> str:
    """Shell that removes each release in `lines` and then appends its ledger line, printing
    `PRUNED_MARK id` for each done; one that fails is left (and unrecorded), the rest go on."""
    parts = [f"{{ rm -rf -- {files.q(str(layout.release(rid)))} && "
             f"( {files.append_lines_script(str(layout.base), str(layout.ledger), [line])} ) && "
             f"echo {PRUNED_MARK} {files.q(rid)}; }}" for rid, line in lines.items()]
    return "; ".join(parts)


def pruned_by(stdout: str, lines: dict[str, str]) -> list[str]:
    """The releases prune_script's output says it removed and recorded."""
    done = {ln.split(" ", 1)[1] for ln in stdout.splitlines() if ln.startswith(PRUNED_MARK + " ")}
    return [rid for rid in lines if rid in done]


def rotation_script(layout: HostLayout, ranges: list[tuple[int, int]], stamp: str) -> tuple[str, str]:
    """Shell that moves the ledger's lines in `ranges` into ledger-archive/ledger.<stamp>.jsonl and
    prints `ROTATED_MARK archive`; and the archive's path."""
    archive = str(layout.ledger_archive / f"ledger.{stamp}.jsonl")
    script = files.drop_lines_script(str(layout.ledger), archive, ranges)
    return f"( {script} ) && echo {ROTATED_MARK} {files.q(archive)}", archive


def read_with_archive(t: TransportLike, layout: HostLayout) -> tuple[str, str]:
    """(the archive's files, oldest first, as one text; the ledger's text), in one command."""
    cat = files.cat_files_script(f"{layout.ledger_archive}/ledger.*.jsonl")
    r = t.run_script(f"{cat}; echo {ARCHIVE_END}; {files.read_optional(str(layout.ledger), '')}",
                     timeout=60, check=True)
    archived, _, current = r.stdout.rpartition(f"{ARCHIVE_END}\n")
    return archived, current
