#!/usr/bin/env bash
# Runs in a kernel-matrix guest (an EXTRA step of scripts/kernels/run.sh):
# the BPF selftests' sockmap_basic, with the test_progs that
# scripts/kernels/build.sh built from the patched 6.12 tree (DIR, default
# /var/cache/eztunnel/kernels/*-ezbp/selftests/bpf), and checks the result
# against the kernel it runs on:
#   - a kernel with the sk_msg ingress backpressure (kernel/patches: the
#     function tcp_bpf_stream_memory_free in its BTF, the agent's probe):
#     every subtest passes;
#   - a kernel without it: every subtest passes but patch 0002's
#     "sockmap sk_msg ingress backpressure", which must fail (the test
#     detects a kernel that lacks the change).
# Exits non-zero otherwise, or when it cannot run.
# Usage: bpf-selftests.sh [DIR]
set -uo pipefail
DIR=${1:-}
if [ -z "$DIR" ]; then
	for d in /var/cache/eztunnel/kernels/*-ezbp/selftests/bpf; do DIR=$d; done
fi
SUBTEST="sockmap sk_msg ingress backpressure"
[ -x "$DIR/test_progs" ] || { echo "bpf-selftests: no test_progs in '$DIR' (sudo make kernel-bp builds it)" >&2; exit 1; }
command -v bpftool >/dev/null || { echo "bpf-selftests: bpftool not found" >&2; exit 1; }

# (grep reads to the end: with -q and pipefail, bpftool's SIGPIPE would
# read as no match)
if bpftool btf dump file /sys/kernel/btf/vmlinux format raw | grep "FUNC 'tcp_bpf_stream_memory_free'" >/dev/null; then
	patched=1
else
	patched=0
fi
echo "bpf-selftests: kernel $(uname -r), backpressure change present: $patched"

# test_progs writes next to itself and reads its objects from its working
# directory: a writable copy.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -a "$DIR/." "$work/"
cd "$work" || exit 1
./test_progs -t sockmap_basic >"$work/out.txt" 2>&1
rc=$?
cat "$work/out.txt"
echo "bpf-selftests: test_progs exited $rc"

# Subtest lines: "#NNN/MM    sockmap_basic/<name>:OK|FAIL|SKIP" (failed
# ones again in the closing summary).
results=$(grep -E '^#[0-9]+/[0-9]+ +sockmap_basic/' "$work/out.txt" | sed -E 's/^#[0-9]+\/[0-9]+ +sockmap_basic\///' | sort -u)
[ -n "$results" ] || { echo "bpf-selftests: FAIL: no sockmap_basic subtest ran" >&2; exit 1; }
bp=$(grep -F "$SUBTEST:" <<<"$results" | sed 's/.*://')
others_failed=$(grep -vF "$SUBTEST:" <<<"$results" | grep -v ':OK$' || true)
total=$(wc -l <<<"$results")
echo "bpf-selftests: $total subtests; \"$SUBTEST\": ${bp:-not run}"
[ -n "$bp" ] || { echo "bpf-selftests: FAIL: \"$SUBTEST\" did not run (test_progs not built from kernel/patches?)" >&2; exit 1; }
if [ -n "$others_failed" ]; then
	echo "bpf-selftests: FAIL: other subtests did not pass:" >&2
	echo "$others_failed" >&2
	exit 1
fi
if [ "$patched" = 1 ] && [ "$bp" != OK ]; then
	echo "bpf-selftests: FAIL: the kernel has the change, and \"$SUBTEST\" is $bp" >&2
	exit 1
fi
if [ "$patched" = 0 ] && [ "$bp" != FAIL ]; then
	echo "bpf-selftests: FAIL: the kernel lacks the change, and \"$SUBTEST\" is $bp: the test does not detect it" >&2
	exit 1
fi
echo "bpf-selftests: ok"
