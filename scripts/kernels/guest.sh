#!/usr/bin/env bash
# Runs inside the virtme-ng guest (scripts/kernels/run.sh boots it): prepares
# what eztunnel and the e2e tests need (bpffs, cgroup2, BTF, modules), then
# runs the steps listed in $OUT/steps, in order, one per line:
#     name<TAB>shell command
# Each step's output goes to $OUT/<name>.log; its exit code and duration are
# appended to $OUT/results.tsv (name, exit code, seconds). A step that exits
# 77 was skipped (e.g. a subcommand the binary does not have yet).
# Usage: guest.sh OUT KROOT BIN   (OUT: the results directory, shared
# read-write with the host; KROOT: the extracted kernel package, holding
# lib/modules; BIN: the host-built binaries)
set -uo pipefail
OUT=$1 KROOT=$2 BIN=$3
export EZ_BIN=$BIN # for EXTRA steps: the host-built binaries
export EZ_KROOT=$KROOT # and the booted kernel's cache directory (scripts/kernels/build.sh)
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
: >"$OUT/results.tsv"
uname -r >"$OUT/uname"
awk '{print $1}' /proc/uptime >"$OUT/boot-seconds" # kernel start to here

setup() {
	set -x
	kver=$(uname -r)
	# Modules: vng links /lib/modules/$kver to the extracted package; the host
	# passes that tree in at the same path (/var/cache is a tmpfs in the guest
	# otherwise). Relink if it does not resolve, so request_module and
	# modprobe both find veth, bridge, nf_conntrack, ...
	if [ ! -e "/lib/modules/$kver/modules.dep" ]; then
		mountpoint -q /lib/modules || mount -t tmpfs none /lib/modules
		ln -sfn "$KROOT/lib/modules/$kver" "/lib/modules/$kver"
	fi
	cat /proc/sys/kernel/modprobe
	# GUEST_MODULES (run.sh) in $OUT/guest-modules: loaded before the steps.
	modprobe -a $(cat "$OUT/guest-modules" 2>/dev/null || echo veth bridge nf_conntrack) || return 1
	# bpffs
	mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf || return 1
	# cgroup2: eztunnel and netlab take the first cgroup2 mount in /proc/mounts.
	if ! awk '$3 == "cgroup2" {f=1} END {exit !f}' /proc/mounts; then
		mount -t cgroup2 none /sys/fs/cgroup || return 1
	fi
	cg=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
	echo "cgroup2 at $cg: controllers $(cat "$cg/cgroup.controllers")"
	ls -la /sys/kernel/btf/vmlinux || return 1
	# The binaries into RAM, at the same path: 9p (cache=none) reads the whole
	# static binary on every exec otherwise.
	mkdir -p /run/eztunnel-bin && cp -a "$BIN/." /run/eztunnel-bin/ && mount --bind /run/eztunnel-bin "$BIN" || return 1
	ip link set lo up
	mkdir -p /run/netns
	ulimit -l unlimited
	grep -E ' (cgroup2?|bpf|9p|overlay|tmpfs) ' /proc/mounts
	set +x
}

run_step() { # name command
	local name=$1 cmd=$2 t0 t1 rc
	echo "== $name: $cmd" >>"$OUT/guest.log"
	t0=$(date +%s.%N)
	if [ "$name" = setup ]; then
		setup >"$OUT/setup.log" 2>&1
	else
		(cd "$OUT" && bash -c "$cmd") >"$OUT/$name.log" 2>&1 </dev/null
	fi
	rc=$?
	t1=$(date +%s.%N)
	awk -v n="$name" -v rc="$rc" -v a="$t0" -v b="$t1" 'BEGIN {printf "%s\t%s\t%.1f\n", n, rc, b - a}' >>"$OUT/results.tsv"
	return $rc
}

if ! run_step setup setup; then
	echo "setup failed: steps not run (see setup.log)" >>"$OUT/guest.log"
	exit 1
fi
while IFS=$'\t' read -r name cmd; do
	[ -n "$name" ] && [ "${name#\#}" = "$name" ] || continue
	run_step "$name" "$cmd"
done <"$OUT/steps"
dmesg >"$OUT/dmesg.log" 2>&1
exit 0
