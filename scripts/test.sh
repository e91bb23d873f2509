#!/usr/bin/env bash
# The test command: installs what it needs (scripts/setup.sh), then runs the whole suite: the
# end-to-end lab tests (one at a time: they share the lab's hosts) and, beside them, the unit tests
# at a lower CPU priority. The lab tests spend most of their time waiting on engines and timeouts
# (load ~1 on 2 cores), so the unit tests fit in the idle CPU. Arguments go to both runs; the unit
# run's output follows the lab run's. Naming test paths (`bash scripts/test.sh tests/unit -q`)
# runs just those, in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
bash scripts/setup.sh
echo "test: set-up took $((SECONDS - t0))s (cache ${FLEETSPEC_CACHE:-/var/cache/fleetspec})"
for arg in "$@"; do
  case $arg in -*) ;; *) if [ -e "${arg%%::*}" ]; then exec python3 -m pytest -p no:cacheprovider "$@"; fi ;; esac
done
unit_out=$(mktemp /var/tmp/fleetspec-unit-tests.XXXXXX)
times_dir=$(mktemp -d /var/tmp/fleetspec-test-times.XXXXXX)   # JUnit XML of both runs: seconds per file
unit_pid=
lab_out=
# The unit run is a session and process group of its own (below): a signal to this script's group
# no longer reaches it, so every way out of this script ends that group (pytest and the sshds and
# commands it started) by its id; TERM, HUP and INT run the EXIT trap. (Not INT to pytest: a
# background job starts with SIGINT ignored, and Python then never raises KeyboardInterrupt.)
trap 'if [ -n "$unit_pid" ]; then kill -TERM -- "-$unit_pid" 2>/dev/null || true; fi; rm -rf "$unit_out" "${lab_out:-}" "$times_dir"' EXIT
trap 'exit 143' TERM
trap 'exit 129' HUP
trap 'exit 130' INT
t1=$SECONDS
# nice alone is not enough: with the kernel's autogroup scheduling (sched_autogroup_enabled=1,
# Debian's default) a task's nice counts only inside its session's group, and the lab's hosts sit
# in a cgroup of their own, so a nice 19 unit run competed with the lab's engines as an equal
# group. So the unit run gets a session of its own and that group is nice 19 too.
# (Written by the new session itself: from here it could still be this script's own group.)
setsid sh -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 python3 -m pytest -p no:cacheprovider tests/unit "$@"' \
  sh --junitxml="$times_dir/unit.xml" "$@" >"$unit_out" 2>&1 &
unit_pid=$!
(  # one line as soon as the unit tests end, so a broken build shows before the lab tests do
  while kill -0 "$unit_pid" 2>/dev/null; do sleep 5; done
  echo "test: unit tests ended after $((SECONDS - t1))s: $(tail -n 1 "$unit_out" 2>/dev/null)"
) &
lab_out=$(mktemp /var/tmp/fleetspec-lab-tests.XXXXXX)
lab_rc=0
python3 -m pytest -p no:cacheprovider tests/lab --junitxml="$times_dir/lab.xml" "$@" 2>&1 | tee "$lab_out" || lab_rc=$?
lab_s=$((SECONDS - t1))
echo "test: lab tests took ${lab_s}s (exit $lab_rc)"
unit_rc=0
wait "$unit_pid" || unit_rc=$?
unit_pid=
unit_s=$(grep -o "in [0-9.]*s" "$unit_out" | tail -n 1 | tr -dc "0-9." || true)
echo "test: unit tests (run beside the lab tests, nice 19 in a session of their own), exit $unit_rc:"
cat "$unit_out"
echo "test: phase times: set-up $((t1 - t0))s, unit ${unit_s:-?}s (beside the lab), lab ${lab_s}s, all $((SECONDS - t0))s"
echo "test: the 15 slowest tests of both runs:"
grep -hE '^[0-9]+\.[0-9]+s (call|setup|teardown) ' "$lab_out" "$unit_out" | sort -rn | head -n 15 || true
echo "test: seconds per lab test file (setup, call and teardown; the lab is the longest phase):"
python3 scripts/test_times.py "$times_dir/lab.xml" || true
rm -f "$lab_out"
[ "$lab_rc" -eq 0 ] && [ "$unit_rc" -eq 0 ]
