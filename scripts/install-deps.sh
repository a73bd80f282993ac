#!/usr/bin/env bash
# Installs what building, testing and the benchmark lab need (Debian/Ubuntu).
#
#   scripts/install-deps.sh [group ...]    default: every group
#
# Groups: build (the agent and its eBPF objects), lab (the benchmark lab's
# peers: make demo, bench quick/lab/bypass), test (the clients make test's
# e2e suite runs), k8s (make test-k8s's cluster), bench (bench services).
#
# Do no harm to the host: a daemon a package brings is never started by the
# install (policy-rc.d answers 101 while apt runs, unless the host already
# has a policy-rc.d), and only the packages installed in this run get their
# services disabled. A service that was there before, running or not, is not
# touched: tests and the lab start their own copies, in their own namespaces.
set -euo pipefail
# depcheck (scripts/depcheck) reads every pkgs_<group>=(...) line.
pkgs_build=(sudo make clang-19 llvm-19 libbpf-dev bpftool iproute2 iptables util-linux mount)
pkgs_lab=(haproxy redis-server redis-tools iperf3 nginx wrk stress-ng) # meshlab's proxies and servers, bench lab's workloads
pkgs_test=(python3 python3-minimal curl openjdk-17-jdk-headless openjdk-17-jre-headless) # test/e2e/eagain_test.go runs these
pkgs_k8s=(etcd-server containerd runc containernetworking-plugins # make test-k8s: the cluster, lab/k8scluster
	busybox-static) # TestGettingStarted: the page's busybox pods, an image of /bin/busybox
pkgs_bench=(d-itg # bench services: ITGSend/ITGRecv/ITGDec, TCP throughput and UDP latency
	nftables) # only kube-proxy's nftables mode in bench services uses it: it execs nft; our code never runs nft
# The packages whose daemons must not start on their own.
daemons=(haproxy:haproxy nginx:nginx redis-server:redis-server etcd-server:etcd containerd:containerd)

groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(build lab test k8s bench)
pkgs=()
for g in "${groups[@]}"; do
	case $g in
	build) pkgs+=("${pkgs_build[@]}") ;;
	lab) pkgs+=("${pkgs_lab[@]}") ;;
	test) pkgs+=("${pkgs_test[@]}") ;;
	k8s) pkgs+=("${pkgs_k8s[@]}") ;;
	bench) pkgs+=("${pkgs_bench[@]}") ;;
	*) echo "install-deps: unknown group $g (build lab test k8s bench)" >&2; exit 2 ;;
	esac
done

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	[ "$(id -u)" = 0 ] || { echo "install-deps: installing ${missing[*]} needs root" >&2; exit 1; }
	policy=/usr/sbin/policy-rc.d
	ours=""
	if [ ! -e "$policy" ]; then
		ours=$policy
		trap 'rm -f "$ours"' EXIT
		printf '#!/bin/sh\n# eztunnel install-deps: no daemon starts during its apt run\nexit 101\n' >"$policy"
		chmod 755 "$policy"
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}"
	[ -z "$ours" ] || { rm -f "$ours"; trap - EXIT; }
	# Installed now, so not running before this run: stop them (where a
	# policy-rc.d of the host's let them start) and disable them. Nothing
	# else is touched.
	for d in "${daemons[@]}"; do
		pkg=${d%%:*} svc=${d#*:}
		for m in "${missing[@]}"; do
			if [ "$m" = "$pkg" ]; then
				if [ -d /run/systemd/system ]; then
					systemctl disable --now "$svc" >/dev/null 2>&1 || true
				else
					service "$svc" stop >/dev/null 2>&1 || true
					update-rc.d "$svc" disable >/dev/null 2>&1 || true
				fi
			fi
		done
	done
fi
command -v go >/dev/null || { echo "Go toolchain not found (need go >= 1.26, go.mod's)" >&2; exit 1; }
