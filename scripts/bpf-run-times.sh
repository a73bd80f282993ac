#!/usr/bin/env bash
# Per-program BPF run times while a command runs: enables kernel.bpf_stats_enabled, samples
# `bpftool prog show -j` every 0.5 s (programs of agents come and go), runs the command, restores
# the sysctl, and prints, per program name starting with ez_, the runs and the mean ns per run over
# every program id seen (the last sample of each id). Usage (root):
#   scripts/bpf-run-times.sh OUT.tsv -- COMMAND [ARGS...]
# bpf_stats adds two clock reads to every run: compare programs measured alike, not absolute cost.
set -euo pipefail
out=$1; shift
[ "${1:-}" = "--" ] && shift
command -v bpftool >/dev/null || { echo "bpftool not found" >&2; exit 1; }
command -v jq >/dev/null || { echo "jq not found" >&2; exit 1; }
old=$(sysctl -n kernel.bpf_stats_enabled)
samples=$(mktemp -d)
cleanup() {
	[ -n "${sampler:-}" ] && kill "$sampler" 2>/dev/null && wait "$sampler" 2>/dev/null || true
	sysctl -q -w kernel.bpf_stats_enabled="$old"
	rm -rf "$samples"
}
trap cleanup EXIT
sysctl -q -w kernel.bpf_stats_enabled=1
(
	i=0
	while :; do
		bpftool prog show -j 2>/dev/null | jq -c '.[] | select(.name // "" | startswith("ez_")) | {id, name, run_cnt: (.run_cnt // 0), run_time_ns: (.run_time_ns // 0)}' >"$samples/$i" || true
		i=$((i + 1))
		sleep 0.5
	done
) &
sampler=$!
rc=0
"$@" || rc=$?
kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
sampler=
cat "$samples"/* | jq -s -r '
	group_by(.id) | map(max_by(.run_cnt)) | group_by(.name)
	| map({name: .[0].name, ids: length, runs: (map(.run_cnt) | add), ns: (map(.run_time_ns) | add)})
	| sort_by(-.ns) | .[] | [.name, .ids, .runs, .ns, (if .runs > 0 then (.ns / .runs | floor) else 0 end)] | @tsv' |
	(printf 'program\tids\truns\trun_time_ns\tns_per_run\n'; cat) | tee "$out"
exit $rc
