#!/bin/sh
# Builds the Kubernetes binaries the cluster test runs (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl) from
# this module into a cache keyed by go.mod + go.sum, and prints the bin dir.
# A complete cache dir is reused as is. CACHE overrides the cache root.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=${CACHE:-/var/cache/eztunnel/k8s}
key=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-16)
bin="$root/$key/bin"
cmds="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"
if [ -f "$bin/.complete" ]; then echo "$bin"; exit 0; fi
mkdir -p "$bin.tmp"
pkgs=""
for c in $cmds; do pkgs="$pkgs k8s.io/kubernetes/cmd/$c"; done
cd "$here"
# The release's version stamped as its own build does (helm checks the
# chart's kubeVersion against the API server's).
v=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$here/go.mod")
minor=$(echo "$v" | cut -d. -f2)
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ld="$ld -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
# One go build for all six shares the compile cache and runs in parallel.
GOWORK=off GOFLAGS=-mod=mod GOSUMDB=off CGO_ENABLED=0 \
	go build -tags providerless -trimpath -ldflags "$ld" -o "$bin.tmp/" $pkgs >&2
rm -rf "$bin"
mv "$bin.tmp" "$bin"
touch "$bin/.complete"
echo "$bin"
