#!/usr/bin/env bash
# The kernel matrix (`sudo make test-kernels`, docs/kernels.md): boots Debian's
# own kernels under qemu with virtme-ng (the host's root file system, read-only,
# as the guest's) and runs a list of steps in each: the agent's preflight, the
# e2e test binary, extra commands. Prints kernel | step | exit code | duration
# and exits non-zero when a step failed.
#
# Variables (environment or make):
#   KERNELS      series to boot, default "6.1 6.12"; 6.12-bp is Debian's 6.12
#                with kernel/patches, built by scripts/kernels/build.sh
#   STEPS        step groups in order, default "preflight prog e2e rtt extra":
#                  smoke      uname -r, modprobe of the modules the tests use,
#                             /sys/kernel/btf/vmlinux, eztunnel --help
#                  preflight  eztunnel preflight -o json > preflight.json, and
#                             the table in preflight.log
#                  prog       the program-level tests (TestProg*: the bypass's
#                             and the services' tc programs run through
#                             BPF_PROG_TEST_RUN against this kernel's helpers,
#                             FIB and conntrack)
#                  e2e        the e2e test binary, -test.run "$E2E_RUN", -test.v
#                  rtt        eztunnel-lab bench quick, small: the ping-pong
#                             RTT ratio, shortcut vs plain (TCG-distorted)
#                  extra      each line of $EXTRA, as steps extra1, extra2, ...
#   E2E_RUN      -test.run regexp, default: the VM set below
#   E2E_SKIP     -test.skip regexp, default: TestServices' slowest subtests
#   E2E_TIMEOUT  -test.timeout, default 20m
#   E2E_TIME_SCALE  EZTUNNEL_E2E_TIME_SCALE for the tests' deadlines, default 30
#   E2E_FULL     1: EZTUNNEL_E2E_FULL, the tests keep their full counts under TCG
#   EXTRA        shell commands, one a line, run in the results directory
#   RESULTS      host results directory, default /var/tmp/eztunnel-kernels;
#                each kernel's in RESULTS/<uname -r>/ (results.tsv, <step>.log,
#                setup.log, console.log, dmesg.log)
#   GUEST_MODULES  modules loaded before the steps, default "veth bridge
#                br_netfilter vxlan nf_conntrack nf_nat", as on a Kubernetes
#                node (nf_nat holds the kfunc bpf_ct_set_nat_info NodePort
#                needs; the bypass's multi-node lab needs br_netfilter)
#   VM_MEMORY (3G), VM_CPUS (2), VM_TIMEOUT (seconds per kernel, 1500),
#   VM_TCG_THREAD (single: every vCPU on one host thread; multi)
#   RODIRS       host directories passed read-only into each guest at their
#                host paths (space-separated), for EXTRA steps that need
#                them (/var/cache and /var/tmp are the guest's own tmpfs)
#
# Caches, kept between runs: /var/cache/eztunnel/vng (virtme-ng's venv),
# /var/cache/eztunnel/apt (a private apt index: the host's apt sources and
# state are not touched), /var/cache/eztunnel/kernels/<version> (the extracted
# linux-image packages, depmod run). Everything else it makes goes at exit.
set -euo pipefail
{ # read to the closing brace before running: an edit to this file mid-run cannot break the run

KERNELS=${KERNELS:-"6.1 6.12"}
STEPS=${STEPS:-"preflight prog e2e rtt extra"}
# The VM set: the parts table (preflight), a connection accelerated
# byte-exact with counters moving and uninstall leaving nothing
# (TestAgentLifecycle, TestParts), EOF and RST on close against plain TCP
# (TestSemantics), blocking half-close exchanges without EAGAIN (TestHalfClose),
# the stuck-receiver bound counted and gauged
# (TestBackpressureStuckReader), a Service through the LB (TestServices), the
# bypass where the kernel has it (TestBypassSameNode), the RST on close as
# the agent runs it (TestCloseResetAgent), NodePort (TestServicesNodePort),
# pairing under the node's DNAT (TestDNAT), learnt once per connection where
# the fentry on __nf_conntrack_confirm loads and handed over between learners
# (TestNATHookScope, TestNATHookChange). Not
# TestUninstallUnderTraffic: its readers drain up to 1 GiB of redirected bytes
# (--max-unread 1 GiB) within a 60 s drain, which TCG's pace cannot.
E2E_RUN=${E2E_RUN:-'TestParts|TestAgentLifecycle|TestReadCounterChange|TestReadHookScope|TestSemantics|TestHalfClose|TestBackpressureStuckReader|TestServices$|TestBypassSameNode|TestCloseResetAgent|TestServicesNodePort|TestDNAT$|TestNATHookScope|TestNATHookChange'}
# Subtests that take minutes under TCG are left out (-test.skip), each
# proven natively by make test: of TestServices the set keeps ClusterIP TCP
# and UDP, no backends, pairing through the LB and the destruction of a
# removed backend's sockets (or its part's reason); of TestDNAT the
# accelerated DNAT in a pod and in the host (learnt by the fentry where it loads),
# not the plain-TCP baseline (accel=false) nor one source to two
# destinations (shared-source, 16 MiB each way per leg: make test runs
# them, and TestDNATDevQueue runs them with net_dev_queue); of TestParts the
# preflight table and an optional part refused, not a required one refused
# (kernel-independent: the agent stops before pinning anything). The first
# element is parenthesized: go test splits a pattern at a top-level | into
# alternatives, and a one-element alternative would skip whole tests.
E2E_SKIP_DEFAULT='(TestServices|TestDNAT|TestParts)/(backends_replaced|udp_backend_removed|session_affinity|metrics|proxy_learns|pod_left|restart_keeps|turned_off|accel=false|shared-source|required_refused)'
E2E_SKIP=${E2E_SKIP:-$E2E_SKIP_DEFAULT}
E2E_TIME_SCALE=${E2E_TIME_SCALE:-30} # EZTUNNEL_E2E_TIME_SCALE: TCG runs about 30x slower
E2E_FULL=${E2E_FULL:-0}
E2E_TIMEOUT=${E2E_TIMEOUT:-20m}
EXTRA=${EXTRA:-}
RESULTS=${RESULTS:-/var/tmp/eztunnel-kernels}
GUEST_MODULES=${GUEST_MODULES:-"veth bridge br_netfilter vxlan nf_conntrack nf_nat"}
VM_MEMORY=${VM_MEMORY:-3G}
VM_CPUS=${VM_CPUS:-2}
VM_TIMEOUT=${VM_TIMEOUT:-1500}
# One host thread runs every vCPU in turn (qemu's -accel tcg,thread=single).
# With a thread per vCPU (multi-threaded TCG), a vCPU can still run code it
# translated before another vCPU patched it: Debian's 6.12 died twice of an
# "Oops: int3" at a static key's site, the int3 that text_poke_bp had already
# replaced (at boot in sched_clock_cpu, and in sock_recvmsg while the read
# tracepoint was attached and detached under load). multi keeps the old mode.
VM_TCG_THREAD=${VM_TCG_THREAD:-single}
case $VM_TCG_THREAD in single | multi) ;; *) echo "VM_TCG_THREAD=$VM_TCG_THREAD: want single or multi" >&2; exit 2 ;; esac
RODIRS=${RODIRS:-}
VNG_VERSION=${VNG_VERSION:-1.42} # virtme-ng from PyPI, the version tried
CACHE=/var/cache/eztunnel
VENV=$CACHE/vng
APTDIR=$CACHE/apt
KCACHE=$CACHE/kernels

if [ "$(id -u)" != 0 ]; then
	echo "scripts/kernels/run.sh needs root: sudo make test-kernels" >&2
	exit 1
fi
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"

WORK="" VMPID="" TMPX=""
cleanup() {
	if [ -n "$VMPID" ] && kill -0 "$VMPID" 2>/dev/null; then
		kill -TERM -- "-$VMPID" 2>/dev/null || true # timeout's process group: vng, qemu
		sleep 2
		kill -KILL -- "-$VMPID" 2>/dev/null || true
	fi
	[ -n "$TMPX" ] && rm -rf "$TMPX"
	[ -n "$WORK" ] && rm -rf "$WORK"
	return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "kernels: $*" >&2; }

# --- tools: qemu, busybox and kmod (apt), virtme-ng (PyPI, in its own venv) -
# kmod: depmod for the extracted kernels here, modprobe in the guest (which
# runs the host's root file system).
need=()
for p in qemu-system-x86 busybox-static file kmod; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [ ! -x "$VENV/bin/vng" ] || [ "$("$VENV/bin/vng" --version 2>/dev/null | awk '{print $NF}')" != "$VNG_VERSION" ]; then
	log "installing virtme-ng $VNG_VERSION into $VENV"
	rm -rf "$VENV"
	/usr/bin/python3 -m venv "$VENV"
	"$VENV/bin/pip" install -q "virtme-ng==$VNG_VERSION"
fi
export PATH=$VENV/bin:$PATH # vng runs virtme-run from PATH

# --- binaries, built on the host (Go under TCG takes minutes) ---------------
WORK=$(mktemp -d /tmp/eztunnel-kernels.XXXXXX)
chmod 755 "$WORK" # the e2e not-root case runs the agent as nobody
BIN=$WORK/bin
mkdir -m 755 "$BIN"
log "building eztunnel, eztunnel-lab and the e2e test binary into $BIN"
ld="-s -w -X main.version=e2e-build" # the version test/e2e expects
CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$BIN/eztunnel" ./cmd/eztunnel
CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$BIN/eztunnel-lab" ./lab/cmd/eztunnel-lab
go test -c -o "$BIN/e2e.test" ./test/e2e
go test -c -o "$BIN/bypass.test" ./internal/datapath/bypass
go test -c -o "$BIN/services.test" ./internal/datapath/services
# The Go programs the e2e tests run in pods (the guest has no go command):
# the io.Copy proxy of TestSpliceProxy and the net package's tests.
go build -o "$BIN/goproxy" ./test/e2e/testdata/goproxy
go test -c -o "$BIN/net.test" net
GOROOT_HOST=$(go env GOROOT)
cp scripts/kernels/guest.sh "$WORK/guest.sh" # the guest reads this copy, not the work tree

# --- kernels ------------------------------------------------------------------
APTO=(-o "Dir::Etc::SourceList=$APTDIR/sources.list" -o "Dir::Etc::SourceParts=$APTDIR/empty"
	-o Dir::Etc::Preferences=/nonexistent -o "Dir::Etc::PreferencesParts=$APTDIR/empty"
	-o "Dir::State::Lists=$APTDIR/lists" -o "Dir::Cache=$APTDIR/cache" -o Dir::State::status=/dev/null
	-o APT::Get::List-Cleanup=0 -o Acquire::Languages=none -o APT::Sandbox::User=root)

# A private index of bookworm, bookworm-security (6.1 and, since 12.x, the
# 6.12 series are there) and bookworm-backports, refreshed once a day.
apt_index() {
	mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial" "$APTDIR/empty"
	local k=/usr/share/keyrings/debian-archive-keyring.gpg
	cat >"$APTDIR/sources.list" <<-EOF
		deb [signed-by=$k] http://deb.debian.org/debian bookworm main
		deb [signed-by=$k] http://deb.debian.org/debian bookworm-backports main
		deb [signed-by=$k] http://deb.debian.org/debian-security bookworm-security main
	EOF
	if [ -z "$(find "$APTDIR/lists" -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
		log "refreshing the kernel package index in $APTDIR"
		apt-get "${APTO[@]}" update -qq || return 1
	fi
}

# The newest linux-image package of a series that apt can download. On
# 2026-11-26 these were linux-image-6.1.0-56-amd64 (6.1.192-2) and
# linux-image-6.12.117+deb12-amd64 (6.12.117-1~deb12u1), both from
# bookworm-security.
series_pattern() {
	case $1 in
	6.1) echo '^linux-image-6\.1\.0-[0-9]+-amd64$' ;;
	6.12) echo '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' ;;
	*) echo "unknown kernel series $1 (known: 6.1 6.12 6.12-bp)" >&2; return 1 ;;
	esac
}
resolve() {
	local pat p
	pat=$(series_pattern "$1") || return 1
	for p in $(apt-cache "${APTO[@]}" pkgnames linux-image-"$1" | grep -E "$pat" | sort -Vr); do
		if apt-cache "${APTO[@]}" policy "$p" | grep 'Candidate: [0-9]' >/dev/null; then
			echo "${p#linux-image-}"
			return 0
		fi
	done
	return 1
}

# fetch SERIES: sets KVER to the kernel version, its package downloaded,
# extracted into $KCACHE/<version> and depmod run there, unless cached.
fetch() {
	local kver="" deb
	# 6.12-bp: Debian's 6.12 source with kernel/patches, built here
	# (scripts/kernels/build.sh; cached in $KCACHE like the packages).
	if [ "$1" = 6.12-bp ]; then
		kver=$(bash "$REPO/scripts/kernels/build.sh" | tail -1) || return 1
		KVER=$kver
		return 0
	fi
	if apt_index && kver=$(resolve "$1"); then :; else
		# Offline: the newest cached extraction of the series.
		kver=$(ls "$KCACHE" 2>/dev/null | grep -E "$(series_pattern "$1" | sed 's/^\^linux-image-/^/')" | sort -Vr | head -1) || true
		[ -n "$kver" ] && [ -e "$KCACHE/$kver/.complete" ] || { echo "no linux-image for $1" >&2; return 1; }
		log "$1: using cached $kver (package index unavailable)"
	fi
	if [ ! -e "$KCACHE/$kver/.complete" ]; then
		log "$1: downloading and extracting linux-image-$kver"
		# (called in an if: set -e is off here, hence the || return)
		mkdir -p "$KCACHE" || return 1
		TMPX=$(mktemp -d "$KCACHE/.extract.XXXXXX") || return 1
		(cd "$TMPX" && apt-get "${APTO[@]}" download -qq "linux-image-$kver") || return 1
		deb=$(ls "$TMPX"/*.deb) || return 1
		mkdir "$TMPX/root" && dpkg-deb -x "$deb" "$TMPX/root" || return 1
		dpkg-deb -f "$deb" Version >"$TMPX/root/.package-version" || return 1
		depmod -b "$TMPX/root" "$kver" || return 1
		rm -rf "${KCACHE:?}/$kver" && mv "$TMPX/root" "$KCACHE/$kver" || return 1
		touch "$KCACHE/$kver/.complete"
		rm -rf "$TMPX"
		TMPX=""
	fi
	KVER=$kver
}

# --- the guest's step list ----------------------------------------------------
write_steps() { # file series
	local q skip=$E2E_SKIP
	{
		printf '# name<TAB>command, run in order by scripts/kernels/guest.sh\n'
		for g in $STEPS; do
			case $g in
			smoke)
				printf 'uname\tuname -r\n'
				printf 'modprobe\tmodprobe -a veth bridge vxlan nf_conntrack nf_nat br_netfilter sch_ingress cls_bpf && lsmod\n'
				printf 'btf\tls -la /sys/kernel/btf/vmlinux\n'
				printf 'help\t%s/eztunnel --help\n' "$BIN"
				;;
			preflight)
				printf 'preflight\t%s/eztunnel preflight -o json >preflight.json; rc=$?; %s/eztunnel preflight; exit $rc\n' "$BIN" "$BIN"
				;;
			prog)
				printf 'prog-bypass\t%s/bypass.test -test.v -test.count=1 -test.run TestProg\n' "$BIN"
				printf 'prog-services\t%s/services.test -test.v -test.count=1 -test.run TestProg\n' "$BIN"
				;;
			e2e)
				# Kernels after 6.1 leave out what only 6.1 needs, each run
				# natively by make test with the kernel's way refused: the
				# legacy tc variants (legacy-tc*, 6.1 has no tcx), the
				# gauge of unread bytes (kept on 6.1, the oldest kernel,
				# where it runs when fexit is refused: no sock_recv_length
				# tracepoint there).
				if [ "$2" != 6.1 ] && [ "$skip" = "$E2E_SKIP_DEFAULT" ]; then
					skip="(TestServices|TestDNAT|TestParts|TestCloseResetAgent|TestBackpressureStuckReader)/${E2E_SKIP_DEFAULT#*/}"
					skip="${skip%)}|legacy-tc|gauge)"
				fi
				q=$(printf '%q' "$E2E_RUN")
				k=$(printf '%q' "$skip")
				printf 'e2e\tcd %s/test/e2e && EZTUNNEL_E2E_TIME_SCALE=%s EZTUNNEL_E2E_FULL=%s GOROOT=%s EZTUNNEL_E2E_BIN_DIR=%s %s/e2e.test -test.v -test.count=1 -test.timeout %s -test.run %s -test.skip %s\n' "$REPO" "$E2E_TIME_SCALE" "$E2E_FULL" "$GOROOT_HOST" "$BIN" "$BIN" "$E2E_TIMEOUT" "$q" "$k"
				;;
			rtt)
				# Pod-to-pod ping-pong, plain TCP vs the shortcut, interleaved
				# rounds (TCG-distorted: a ratio, not a latency).
				printf 'rtt	%s/eztunnel-lab bench quick --rounds 3 --rtt-n 300 --transfer-bytes 4194304\n' "$BIN"
				;;
			extra)
				local n=0
				while IFS= read -r line; do
					[ -n "$line" ] || continue
					n=$((n + 1))
					printf 'extra%d\t%s\n' "$n" "$line"
				done <<<"$EXTRA"
				;;
			*) echo "unknown step group $g (smoke preflight prog e2e rtt extra)" >&2; return 1 ;;
			esac
		done
	} >"$1"
}

# --- boot each kernel ------------------------------------------------------------
mkdir -p "$RESULTS"
summary=$WORK/summary.tsv
failed=0
for series in $KERNELS; do
	t0=$(date +%s.%N)
	KVER=""
	if ! fetch "$series"; then
		printf '%s\tfetch\t1\t-\n' "$series" >>"$summary"
		failed=1
		continue
	fi
	kver=$KVER
	t1=$(date +%s.%N)
	printf '%s\tfetch\t0\t%.1f\n' "$kver" "$(echo "$t1 - $t0" | bc)" >>"$summary"
	OUT=$RESULTS/$kver
	rm -rf "$OUT"
	mkdir -p "$OUT"
	write_steps "$OUT/steps" "$series"
	echo "$GUEST_MODULES" >"$OUT/guest-modules"
	log "$kver: booting (qemu TCG thread=$VM_TCG_THREAD, $VM_CPUS CPUs, $VM_MEMORY); console in $OUT/console.log"
	KROOT=$KCACHE/$kver
	rodirs=()
	for d in $RODIRS; do rodirs+=(--rodir "$d"); done
	# --verbose: without it vng drops the guest's output and exits 255.
	# /var/cache, /var/tmp are tmpfs in the guest: the kernel tree and the
	# results come in at their host paths as their own mounts.
	# A kernel that panics before the guest script starts is booted once
	# more: under TCG Debian's 6.12 has died at 3.7 s of an int3 Oops in
	# sched_clock_cpu (a static key's text_poke racing the emulator's
	# translated code), before any of this repository's code ran. Its
	# console is kept as console.boot1.log; a second panic fails the kernel.
	for boot in 1 2; do
		(cd "$WORK" && exec timeout -k 10 "$VM_TIMEOUT" vng --verbose --disable-kvm \
			--qemu-opts="-accel tcg,thread=$VM_TCG_THREAD" --cpus "$VM_CPUS" --memory "$VM_MEMORY" --run "$KROOT/boot/vmlinuz-$kver" \
			--rodir "$KROOT" --rodir "$WORK" "${rodirs[@]}" --rwdir "$OUT" --overlay-rwdir /root \
			--exec "$WORK/guest.sh $OUT $KROOT $BIN") >"$OUT/console.log" 2>&1 </dev/null &
		VMPID=$!
		rc=0
		wait "$VMPID" || rc=$?
		VMPID=""
		if [ "$boot" = 1 ] && [ ! -e "$OUT/boot-seconds" ] && grep -q 'Kernel panic' "$OUT/console.log"; then
			mv "$OUT/console.log" "$OUT/console.boot1.log"
			log "$kver: the kernel panicked before the guest script started (console.boot1.log); booting once more"
			continue
		fi
		break
	done
	t2=$(date +%s.%N)
	# vng exits 255 even when the guest script ran (its output comes over the
	# console, not virtio-serial): the results decide, only a timeout fails.
	case $rc in 124 | 137) log "$kver: VM timed out after ${VM_TIMEOUT}s"; failed=1 ;; esac
	[ -s "$OUT/results.tsv" ] || { log "$kver: no results (see $OUT/console.log)"; failed=1; }
	printf '%s\tvm (total)\t%s\t%.1f\n' "$kver" "$rc" "$(echo "$t2 - $t1" | bc)" >>"$summary"
	[ -s "$OUT/boot-seconds" ] && printf '%s\tboot (to guest.sh)\t0\t%.1f\n' "$kver" "$(cat "$OUT/boot-seconds")" >>"$summary"
	if [ -s "$OUT/results.tsv" ]; then
		while IFS=$'\t' read -r name src secs; do
			printf '%s\t%s\t%s\t%s\n' "$kver" "$name" "$src" "$secs" >>"$summary"
			case $src in 0 | 77) ;; *) failed=1 ;; esac
		done <"$OUT/results.tsv"
	fi
	# Steps the guest never reached.
	while IFS=$'\t' read -r name _; do
		[ -n "$name" ] && [ "${name#\#}" = "$name" ] || continue
		grep -q "^$name	" "$OUT/results.tsv" 2>/dev/null || { printf '%s\t%s\tnot run\t-\n' "$kver" "$name" >>"$summary"; failed=1; }
	done <"$OUT/steps"
done

{
	printf '%-22s | %-20s | %-9s | %s\n' kernel step "exit code" "duration (s)"
	printf '%s\n' "-----------------------+----------------------+-----------+-------------"
	while IFS=$'\t' read -r k s c d; do
		[ "$c" = 77 ] && c="77 (skip)"
		printf '%-22s | %-20s | %-9s | %s\n' "$k" "$s" "$c" "$d"
	done <"$summary"
} | tee "$RESULTS/summary.txt"
echo "logs: $RESULTS/<kernel>/"
exit $failed
}
