#!/usr/bin/env bash
# A release's artefacts in one directory (make release; DIST, default dist/):
#   eztunnel-image-<version>.tar       the agent's multi-arch OCI image (make image)
#   eztunnel-<chart version>.tgz       the chart, its image pinned by the index's digest
#   kubectl-eztunnel-linux-<arch>      the kubectl plugin, one per platform
#   *.cdx.json                          a CycloneDX SBOM of every binary (cyclonedx-gomod
#                                       reads the Go build information each one carries)
#   SHA256SUMS                          sha256sum of everything above
# docs/operating.md ("Releasing") says how to publish them. Needs make image
# first (its archive and bin/eztunnel-image.values.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${VERSION:?VERSION (git describe)}" "${DIST:=dist}" "${IMAGE_PLATFORMS:=linux/amd64 linux/arm64}"
image=bin/eztunnel-image.tar values=bin/eztunnel-image.values.yaml
[ -f "$image" ] && [ -f "$values" ] || { echo "release: no $image or $values: run make image first" >&2; exit 1; }
# Chart versions are SemVer: a tag v1.2.3 gives 1.2.3, a commit 0.1.0-g<id>.
case $VERSION in
v[0-9]*) chart_version=${VERSION#v} ;;
*) chart_version=0.1.0-g$VERSION ;;
esac
helm=$(go run ./scripts/toolbin helm)
sbom=$(go run ./scripts/toolbin sbom)
work=$(mktemp -d /tmp/ez-release-XXXXXX)
trap 'rm -rf "$work"' EXIT
rm -rf "$DIST" && mkdir -p "$DIST"

cp "$image" "$DIST/eztunnel-image-$VERSION.tar"

# The chart with the image's repository, tag and digest as its defaults.
read -r repo tag digest < <(awk '/repository:/ {r=$2} /tag:/ {gsub(/"/, "", $2); t=$2} /digest:/ {d=$2} END {print r, t, d}' "$values")
[[ $digest == sha256:* ]] || { echo "release: no digest in $values" >&2; exit 1; }
cp -r deploy/helm/eztunnel "$work/chart"
sed -i -e "0,/^  repository: .*/s||  repository: $repo|" -e "0,/^  tag: .*/s||  tag: \"$tag\"|" \
	-e "0,/^  digest: .*/s||  digest: $digest|" "$work/chart/values.yaml"
grep -q "^  digest: $digest\$" "$work/chart/values.yaml" || { echo "release: the chart's image digest was not set" >&2; exit 1; }
"$helm" lint --strict "$work/chart" >/dev/null
"$helm" package "$work/chart" --version "$chart_version" --app-version "$VERSION" -d "$DIST" >/dev/null

for p in $IMAGE_PLATFORMS; do
	os=${p%%/*} rest=${p#*/} arch=${rest%%/*}
	[ "$os/$arch" = "$p" ] || continue # the plugin: plain os/arch platforms only
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "-s -w" -o "$DIST/kubectl-eztunnel-$os-$arch" ./cmd/kubectl-eztunnel
	"$sbom" bin -json -version "$VERSION" -output "$DIST/kubectl-eztunnel-$os-$arch.cdx.json" "$DIST/kubectl-eztunnel-$os-$arch"
done
for bin in bin/*-*/eztunnel; do
	plat=$(basename "$(dirname "$bin")")
	"$sbom" bin -json -version "$VERSION" -output "$DIST/eztunnel-$plat.cdx.json" "$bin"
done
(cd "$DIST" && sha256sum -- * >SHA256SUMS)
ls -1 "$DIST"
