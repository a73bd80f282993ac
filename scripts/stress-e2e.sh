#!/usr/bin/env bash
# Runs the whole e2e suite N times back to back (default 5) while stress-ng
# keeps every CPU busy, and prints one line per run and a closing count. Any
# failure is listed with its test names. Needs root; each run holds the
# kernel-tests lock.   scripts/stress-e2e.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=/tmp/eztunnel-kernel-tests.lock
[ "$(id -u)" = 0 ] || { echo "stress-e2e: needs root" >&2; exit 1; }
command -v stress-ng >/dev/null || { echo "stress-e2e: stress-ng missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
n=${1:-5}
out=results/stress-e2e
mkdir -p "$out"
cpus=$(nproc)
stress-ng --cpu "$cpus" --cpu-method matrixprod --quiet &
hog=$!
trap 'kill "$hog" 2>/dev/null || true; wait "$hog" 2>/dev/null || true' EXIT
echo "stress-e2e: $n runs of the e2e suite with stress-ng --cpu $cpus (pid $hog) running; logs in $out/"
failed=0
for i in $(seq 1 "$n"); do
	start=$SECONDS
	if flock "$LOCK" go test -count=1 -timeout 30m ./test/e2e >"$out/run-$i.log" 2>&1; then
		echo "run $i: PASS in $((SECONDS - start)) s"
	else
		failed=$((failed + 1))
		echo "run $i: FAIL in $((SECONDS - start)) s"
		grep -E -- '^\s*--- FAIL' "$out/run-$i.log" || tail -20 "$out/run-$i.log"
	fi
done
echo "stress-e2e: $((n - failed)) passed, $failed failed"
[ "$failed" = 0 ]
