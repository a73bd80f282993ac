#!/usr/bin/env bash
# Crash test: SIGKILL the e2e tests in the middle of TestDNAT (a lab, host
# iptables chain, host sysctl and a pinned datapath exist), run the e2e suite
# again, which must sweep the killed run's leftovers and pass, then check the
# host is as it was before. Needs root; holds the kernel-tests lock.
#   scripts/crash-test.sh            rerun the whole e2e suite
#   RERUN='-run TestDNAT' scripts/crash-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=/tmp/eztunnel-kernel-tests.lock
if [ -z "${EZ_CRASH_LOCKED:-}" ]; then
	EZ_CRASH_LOCKED=1 exec flock "$LOCK" "$0" "$@"
fi
[ "$(id -u)" = 0 ] || { echo "crash-test: needs root" >&2; exit 1; }
work=$(mktemp -d /tmp/ez-crash-XXXXXX)
trap 'rm -rf "$work"' EXIT
# The go command's work directories (go-build*) go here: SIGKILL skips the
# go command's own removal. The tests' own temporary files go in their run's
# directory, which the rerun removes (test/e2e TestMain).
export GOTMPDIR=$work
go build -o "$work/hoststate" ./scripts/hoststate
# No test: TestMain only sweeps what earlier killed runs left, so the
# snapshot holds no leftover the rerun would sweep.
go test -count=1 -run '^$' ./test/e2e >/dev/null
"$work/hoststate" >"$work/before"

echo "crash-test: starting TestDNAT, killing it once the datapath is pinned"
setsid go test -count=1 -timeout 10m -run '^TestDNAT$' ./test/e2e >"$work/killed.log" 2>&1 &
pgid=$!
deadline=$((SECONDS + 240))
until "$work/hoststate" >"$work/mid" && grep -q '^bpffs /sys/fs/bpf/eztest-dnat/' "$work/mid" &&
	grep -q '^nft chain ip nat EZL-DNAT-dnat ' "$work/mid" && grep -q '^netns ezl-dnat-' "$work/mid"; do
	if ! kill -0 "$pgid" 2>/dev/null; then
		echo "crash-test: FAIL: the test ended before the datapath was pinned:" >&2
		cat "$work/killed.log" >&2
		exit 1
	fi
	if [ $SECONDS -gt $deadline ]; then
		kill -KILL -- -"$pgid" 2>/dev/null || true
		echo "crash-test: FAIL: no pinned datapath after 240s" >&2
		cat "$work/killed.log" >&2
		exit 1
	fi
	sleep 0.2
done
kill -KILL -- -"$pgid"
wait "$pgid" 2>/dev/null || true
# Wait until every process of the group is gone.
for _ in $(seq 100); do kill -0 -- -"$pgid" 2>/dev/null || break; sleep 0.1; done
"$work/hoststate" >"$work/killed"
if diff -q "$work/before" "$work/killed" >/dev/null; then
	echo "crash-test: FAIL: the killed run left nothing behind; the kill came too late to test the sweep" >&2
	exit 1
fi
echo "crash-test: left behind by the killed run:"
diff "$work/before" "$work/killed" | sed -n 's/^> /  /p' || true

echo "crash-test: rerunning the e2e suite ${RERUN:-(all)}"
# shellcheck disable=SC2086
if ! go test -count=1 -timeout 20m ${RERUN:-} ./test/e2e; then
	echo "crash-test: FAIL: the e2e suite after the crash" >&2
	exit 1
fi
"$work/hoststate" >"$work/after"
if ! diff -u "$work/before" "$work/after"; then
	echo "crash-test: FAIL: the host differs from before the crash (- before, + after)" >&2
	exit 1
fi
echo "crash-test: ok: the host is as before"
