#!/usr/bin/env bash
# The test command: installs what it needs (scripts/setup.sh), then runs the whole suite: the
# end-to-end lab tests in two streams at once, each on hosts of its own, and, beside them, the unit
# tests at a lower CPU priority. A lab stream spends much of its time waiting on engines, ssh and
# timeouts (one alone keeps ~1 of 2 cores busy), so two streams on disjoint hosts and fleet roots
# share the machine; the unit tests take what CPU is left. Arguments go to every run; the outputs
# follow one another. Naming test paths (`bash scripts/test.sh tests/unit -q`) runs just those, in
# one process.
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
# The second lab stream: these files, on their own hosts (ct131 like ct129, ct201 like ct200, thin,
# tree and pod hosts of other numbers) and a fleet root of their own (tests/lab/conftest.py). Every
# other lab file runs in the first stream, on ct129 and ct200 of this checkout (the demo's).
LAB_B="test_lab.py test_reliability_concurrency.py test_reliability_crash.py test_reliability_host.py
  test_reliability_input.py test_reliability_network.py test_reliability_security.py test_security_audit.py
  test_security_local_root.py test_gpu_health.py test_mutations.py test_router_rollout.py test_controllers.py"
lab_a=() lab_b=()
for f in tests/lab/test_*.py; do
  case " $(echo $LAB_B) " in *" ${f#tests/lab/} "*) lab_b+=("$f") ;; *) lab_a+=("$f") ;; esac
done
unit_pid=
lab_out=
lab_b_pid=
lab_b_out=
lab_b_root=
# The unit run is a session and process group of its own (below): a signal to this script's group
# no longer reaches it, so every way out of this script ends that group (pytest and the sshds and
# commands it started) by its id; TERM, HUP and INT run the EXIT trap. (Not INT to pytest: a
# background job starts with SIGINT ignored, and Python then never raises KeyboardInterrupt.)
stop_group() { if [ -n "$1" ]; then kill -TERM -- "-$1" 2>/dev/null || true; fi; }
announce_end() {  # pid, what, its output file: one line as soon as that run ends, with its last line
  ( while kill -0 "$1" 2>/dev/null; do sleep 5; done
    echo "test: $2 ended after $((SECONDS - t1))s: $(tail -n 1 "$3" 2>/dev/null)" ) &
}
# The second stream's session stops its hosts; on the way out (early or not) its fleet root's
# `lab down` stops whatever is left, then that root goes.
trap 'stop_group "$unit_pid"; stop_group "$lab_b_pid"
  if [ -n "$lab_b_root" ]; then
    if [ -d "$lab_b_root/inventory" ]; then python3 -m fleetspec --root "$lab_b_root" lab down >/dev/null 2>&1 || true; fi
    rm -rf --one-file-system "$lab_b_root"
  fi
  rm -rf "$unit_out" "${lab_out:-}" "${lab_b_out:-}" "$times_dir"' EXIT
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
announce_end "$unit_pid" "unit tests" "$unit_out"   # a broken build shows before the lab tests end
lab_b_out=$(mktemp /var/tmp/fleetspec-lab-tests-b.XXXXXX)
lab_b_root=$(mktemp -d /var/tmp/fleetspec-lab-root-b.XXXXXX)
setsid env FLEETSPEC_LAB_ROOT="$lab_b_root" FLEETSPEC_LAB_HOSTS=ct131,ct201 FLEETSPEC_LAB_THIN_HOSTS=tn64,tn65,tn66 \
  FLEETSPEC_LAB_TREE_HOST=ct151 FLEETSPEC_LAB_POD_HOSTS=pd2 \
  python3 -m pytest -p no:cacheprovider "${lab_b[@]}" --junitxml="$times_dir/lab-b.xml" "$@" >"$lab_b_out" 2>&1 &
lab_b_pid=$!
announce_end "$lab_b_pid" "lab stream 2 (ct131, ct201)" "$lab_b_out"
lab_out=$(mktemp /var/tmp/fleetspec-lab-tests.XXXXXX)
lab_rc=0
python3 -m pytest -p no:cacheprovider "${lab_a[@]}" --junitxml="$times_dir/lab.xml" "$@" 2>&1 | tee "$lab_out" || lab_rc=$?
echo "test: lab stream 1 (ct129, ct200) took $((SECONDS - t1))s (exit $lab_rc)"
lab_b_rc=0
wait "$lab_b_pid" || lab_b_rc=$?
lab_b_pid=
lab_s=$((SECONDS - t1))
echo "test: lab stream 2 (ct131, ct201, its own fleet root), exit $lab_b_rc:"
cat "$lab_b_out"
echo "test: lab tests took ${lab_s}s (both streams; exit $lab_rc and $lab_b_rc)"
unit_rc=0
wait "$unit_pid" || unit_rc=$?
unit_pid=
unit_s=$(grep -o "in [0-9.]*s" "$unit_out" | tail -n 1 | tr -dc "0-9." || true)
echo "test: unit tests (run beside the lab tests, nice 19 in a session of their own), exit $unit_rc:"
cat "$unit_out"
echo "test: phase times: set-up $((t1 - t0))s, unit ${unit_s:-?}s (beside the lab), lab ${lab_s}s, all $((SECONDS - t0))s"
echo "test: the 15 slowest tests of both runs:"
grep -hE '^[0-9]+\.[0-9]+s (call|setup|teardown) ' "$lab_out" "$lab_b_out" "$unit_out" | sort -rn | head -n 15 || true
echo "test: seconds per lab test file (setup, call and teardown; the lab is the longest phase), stream 1:"
python3 scripts/test_times.py "$times_dir/lab.xml" || true
echo "test: stream 2:"
python3 scripts/test_times.py "$times_dir/lab-b.xml" || true
rm -f "$lab_out" "$lab_b_out"
[ "$lab_rc" -eq 0 ] && [ "$lab_b_rc" -eq 0 ] && [ "$unit_rc" -eq 0 ]
