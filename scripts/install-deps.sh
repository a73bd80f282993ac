#!/usr/bin/env bash
# Installs what building, testing and the benchmark lab need (Debian/Ubuntu).
set -euo pipefail
pkgs=(sudo clang-19 llvm-19 libbpf-dev bpftool iproute2 iptables util-linux mount haproxy redis-server redis-tools iperf3 nginx wrk stress-ng
	python3 python3-minimal curl openjdk-17-jdk-headless openjdk-17-jre-headless # test/e2e/eagain_test.go runs these
	etcd-server containerd runc containernetworking-plugins # make test-k8s: the cluster, lab/k8scluster
	d-itg # bench services: ITGSend/ITGRecv/ITGDec, TCP throughput and UDP latency
	nftables) # only kube-proxy's nftables mode in bench services uses it: it execs nft; our code never runs nft
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The packaged daemons must not run on their own: tests start their own copies.
for s in haproxy nginx redis-server etcd containerd; do
	systemctl disable --now "$s" >/dev/null 2>&1 || service "$s" stop >/dev/null 2>&1 || true
done
command -v go >/dev/null || { echo "Go toolchain not found (need go >= 1.24)" >&2; exit 1; }
