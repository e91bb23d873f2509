"""Generate fleetspec/model/sglang_options/<version>.json from each version's real parser.

A deploy splits the baseline ExecStart with these tables instead of importing sglang (10 s per
host); tests/unit/test_launch_corpus.py regenerates them from the real parsers and fails when a
packaged table differs. Run after adding a version to fleetspec.lab.envs.SGLANG_VERSIONS:

    python3 -m fleetspec.lab.optiontable
"""

from __future__ import annotations

import json
import subprocess
import sys

from fleetspec.model.launch import DUMP_SCRIPT, TABLES, OptionTable, parse_dump


def dump(python: str, timeout: float = 300) -> OptionTable:
    """The option table of the sglang that `python` imports (its real parser, built as
    prepare_server_args builds it)."""
    done = subprocess.run([python, "-c", DUMP_SCRIPT], capture_output=True, text=True, timeout=timeout,
                          cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RuntimeError(f"{python}: option dump failed: {tail}")
    return parse_dump(done.stdout)


def table_text(table: OptionTable) -> str:
    return json.dumps(table.to_dict(), indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    from fleetspec.lab.envs import SGLANG_VERSIONS, local_env

    versions = (argv if argv is not None else sys.argv[1:]) or list(SGLANG_VERSIONS)
    TABLES.mkdir(parents=True, exist_ok=True)
    for version in versions:
        table = dump(str(local_env(version)))
        if table.version != version:
            raise SystemExit(f"the env for {version} imports sglang {table.version}")
        (TABLES / f"{version}.json").write_text(table_text(table))
        print(f"{version}: {len(table.options)} option strings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
