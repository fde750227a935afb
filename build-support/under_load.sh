#!/usr/bin/env bash
# Run Pants test targets several times under a CPU hog (a busy shell loop on every core, nothing
# to install), and fail on any failure (issue 24: timing-dependent tests must not depend on how
# fast the machine is).
#
#   build-support/under_load.sh [--rounds N] [--together] TARGET... [-- PYTEST_ARGS...]
#
# --together runs the rounds at once (more load, a third of the wall time: .ci/run's per-push
# subset); by default they run in a row (.github/workflows/reliability.yml, the whole suite).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rounds=3
together=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --together) together=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ "${#targets[@]}" -eq 0 ]; then
  echo "error: name the test targets to run, e.g. tests/reliability::" >&2
  exit 2
fi

log_dir="$(mktemp -d)"
hog_pids=()
stop_hog() { [ "${#hog_pids[@]}" -eq 0 ] || kill "${hog_pids[@]}" 2>/dev/null || true; }
trap 'stop_hog; rm -rf "$log_dir"' EXIT
for _ in $(seq "$(nproc)"); do
  (while :; do :; done) &
  hog_pids+=($!)
done

echo "under load: ${rounds} round(s) $([ "$together" -eq 1 ] && echo at once || echo in a row)" \
  "of ${targets[*]}, a busy loop on each of $(nproc) cores"
start=$SECONDS
failed=0
report() {  # report N STATUS
  if [ "$2" -eq 0 ]; then
    echo "under load, round $1 of ${rounds}: passed"
  else
    echo "under load, round $1 of ${rounds}: FAILED" >&2
    tail -n 80 "$log_dir/round-$1.log" >&2
    failed=1
  fi
}
if [ "$together" -eq 1 ]; then
  pids=()
  for n in $(seq "$rounds"); do
    ( ./pants test --test-force "${targets[@]}" -- "$@" > "$log_dir/round-$n.log" 2>&1 ) &
    pids+=($!)
  done
  for n in $(seq "$rounds"); do
    status=0
    wait "${pids[$((n - 1))]}" || status=$?
    report "$n" "$status"
  done
else
  for n in $(seq "$rounds"); do
    status=0
    ./pants test --test-force "${targets[@]}" -- "$@" > "$log_dir/round-$n.log" 2>&1 || status=$?
    report "$n" "$status"
  done
fi
echo "under load: $((SECONDS - start)) s for ${rounds} round(s)"
exit "$failed"
