#!/usr/bin/env bash
# Builds Debian's 6.12 kernel with the patches in kernel/patches (the sk_msg
# ingress backpressure, docs/kernels.md) into the kernel cache the kernel
# matrix boots from: /var/cache/eztunnel/kernels/<release>, as
# scripts/kernels/run.sh extracts Debian's packages. `make kernel-bp` runs it;
# `make test-kernel-bp` boots the result.
#
# Source: the linux-source-6.12 package. Configuration: Debian's own
# (linux-config-6.12, amd64), every module dropped but those listed in
# kernel/modules-6.12.txt (make localmodconfig), module signing off, release
# suffix -ezbp. Built with $JOBS jobs (default: the CPUs) in $BUILD (default
# /var/cache/eztunnel/kbuild), which is removed after a successful build
# unless KEEP_BUILD=1. A cached kernel is reused while the source package,
# the patches, the module list and this script are unchanged (a stamp of
# their hashes); FORCE=1 rebuilds. REUSE_BUILD=1 builds in the tree a
# KEEP_BUILD=1 run left in $BUILD as it is (no extraction, patching or
# configuring; make rebuilds what changed), for work on the patches.
#
# The BPF selftests' test_progs is built from the same patched tree
# (SELFTESTS=0 skips it): clang, lld and llvm 19 (/usr/lib/llvm-19/bin first
# in PATH), against the tree's vmlinux BTF, and installed with the objects
# and modules it loads into <cache>/<release>/selftests/bpf, where
# `make test-kernel-bp` runs `test_progs -t sockmap_basic` in the guest
# (patch 0002's subtest among them).
#
# Prints the release on the last line of standard output.
set -euo pipefail
{
if [ "$(id -u)" != 0 ]; then
	echo "scripts/kernels/build.sh needs root: sudo make kernel-bp" >&2
	exit 1
fi
REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=/var/cache/eztunnel
KCACHE=$CACHE/kernels
BUILD=${BUILD:-$CACHE/kbuild}
JOBS=${JOBS:-$(nproc)}
SUFFIX=-ezbp
log() { echo "kernel-bp: $*" >&2; }
# What a build must not touch: the root directory's entries and the
# checkout's files that git does not track (tracked changes show as well).
# Everything a build writes belongs under $CACHE.
snapshot_outside() {
	find / -mindepth 1 -maxdepth 1 -printf 'root %f\n' | sort
	git -C "$REPO" status --porcelain --ignored --untracked-files=all 2>/dev/null | sed 's/^/repo /' | sort
}

need=()
SELFTESTS=${SELFTESTS:-1}
pkgs=(linux-source-6.12 linux-config-6.12 build-essential bc bison flex libelf-dev libssl-dev dwarves python3 cpio kmod)
[ "$SELFTESTS" = 0 ] || pkgs+=(clang-19 lld-19 llvm-19 zlib1g-dev libcap-dev pkg-config rsync)
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi
SRC_TAR=$(ls /usr/src/linux-source-6.12.tar.xz)
CONFIG_XZ=/usr/src/linux-config-6.12/config.amd64_none_amd64.xz
stamp=$( (cat "$REPO"/kernel/patches/*.patch "$REPO/kernel/modules-6.12.txt" "$0"; echo "selftests=$SELFTESTS") |
	sha256sum | cut -c1-16)-$(dpkg-query -W -f='${Version}' linux-source-6.12)

# A cached build of the same inputs.
for d in "$KCACHE"/*"$SUFFIX"; do
	if [ -z "${FORCE:-}" ] && [ -e "$d/.complete" ] && [ "$(cat "$d/.stamp" 2>/dev/null)" = "$stamp" ]; then
		log "cached: $d"
		basename "$d"
		exit 0
	fi
done

t0=$(date +%s)
if [ -n "${REUSE_BUILD:-}" ] && [ -e "$BUILD/linux-source-6.12/.config" ]; then
	log "reusing the tree in $BUILD (REUSE_BUILD)"
	cd "$BUILD/linux-source-6.12"
else
	rm -rf "$BUILD"
	mkdir -p "$BUILD"
	log "extracting $SRC_TAR into $BUILD"
	tar -C "$BUILD" -xf "$SRC_TAR"
	cd "$BUILD/linux-source-6.12"
	for p in "$REPO"/kernel/patches/*.patch; do
		log "applying $(basename "$p")"
		patch -p1 -s <"$p"
	done

	log "configuring: Debian's amd64 configuration, modules of kernel/modules-6.12.txt only"
	xzcat "$CONFIG_XZ" >.config
	{
		echo "Module Size Used by"
		grep -v '^#' "$REPO/kernel/modules-6.12.txt" | awk 'NF {print $1, 0, 0}'
	} >"$BUILD/lsmod"
	make -s olddefconfig >&2
	{ yes "" || :; } | make -s LSMOD="$BUILD/lsmod" localmodconfig >&2
	scripts/config --disable MODULE_SIG --disable MODULE_SIG_ALL \
		--set-str SYSTEM_TRUSTED_KEYS "" --set-str SYSTEM_REVOCATION_KEYS "" \
		--set-str LOCALVERSION "$SUFFIX" --disable LOCALVERSION_AUTO \
		--enable DEBUG_INFO_BTF --enable BPF_SYSCALL --enable NET_SOCK_MSG
	make -s olddefconfig >&2
fi

log "building with $JOBS jobs (log: $BUILD/build.log)"
t1=$(date +%s)
make -s -j"$JOBS" bzImage modules >"$BUILD/build.log" 2>&1 || { tail -40 "$BUILD/build.log" >&2; exit 1; }
t2=$(date +%s)
release=$(cat include/config/kernel.release)
case $release in *"$SUFFIX") ;; *) echo "unexpected kernel release $release" >&2; exit 1 ;; esac
t3=$t2
st=tools/testing/selftests/bpf
if [ "$SELFTESTS" != 0 ]; then
	# Debian's 6.12 carries stable backports of tests without the BPF
	# programs they load (6.12.117's prog_tests/bpf_attr_size.c includes the
	# skeleton of progs/cgroup_skb_direct_packet_access.c, which it lacks):
	# such a test is left out, named here.
	for t in "$st"/prog_tests/*.c; do
		for sk in $(grep -oE '#include "[a-z0-9_]+\.(l|sub)?skel\.h"' "$t" | sed -E 's/.*"([a-z0-9_]+)\.(l|sub)?skel\.h"/\1/'); do
			if [ ! -e "$st/progs/$sk.c" ] && ! grep -qw "$sk" "$st/Makefile"; then
				log "leaving out the selftest $(basename "$t"): its program progs/$sk.c is not in the source"
				rm -f "$t"
				break
			fi
		done
	done
	log "building the BPF selftests' test_progs (log: $BUILD/selftests.log)"
	# Quirk: tools/testing/selftests/lib.mk sets OUTPUT to the current
	# directory only when MAKELEVEL is 0. Under `make kernel-bp` this make
	# is a sub-make (MAKELEVEL 1, inherited through the environment), OUTPUT
	# stays empty and every "$(OUTPUT)/x" becomes "/x": the objects land in
	# the host's root directory and the link fails (-lurandom_read). So the
	# output directory is explicit, and the outer make's MAKELEVEL, MAKEFLAGS
	# and MFLAGS are not passed on.
	snapshot_outside >"$BUILD/outside.before"
	env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS PATH=/usr/lib/llvm-19/bin:$PATH \
		make -j"$JOBS" -C "$st" OUTPUT="$PWD/$st" test_progs >"$BUILD/selftests.log" 2>&1 ||
		{ tail -40 "$BUILD/selftests.log" >&2; exit 1; }
	snapshot_outside >"$BUILD/outside.after"
	new=$(comm -13 "$BUILD/outside.before" "$BUILD/outside.after")
	if [ -n "$new" ]; then
		printf 'kernel-bp: the selftests build wrote outside %s:\n%s\n' "$BUILD" "$new" >&2
		exit 1
	fi
	t3=$(date +%s)
fi

out=$KCACHE/.build.$$
rm -rf "$out"
mkdir -p "$out/boot"
cp arch/x86/boot/bzImage "$out/boot/vmlinuz-$release"
cp .config "$out/boot/config-$release"
make -s INSTALL_MOD_PATH="$out" INSTALL_MOD_STRIP=1 modules_install >&2
if [ "$SELFTESTS" != 0 ]; then
	# test_progs, the objects some tests open by name, the test modules.
	mkdir -p "$out/selftests/bpf"
	rsync -a --include='test_progs' --include='*.bpf.o' --include='*.ko' --exclude='*' "$st/" "$out/selftests/bpf/"
fi
rm -f "$out/lib/modules/$release/build" "$out/lib/modules/$release/source"
depmod -b "$out" "$release"
echo "$stamp" >"$out/.stamp"
printf 'configure+extract %ss, build %ss, selftests %ss (%s jobs, %s)\n' "$((t1 - t0))" "$((t2 - t1))" "$((t3 - t2))" "$JOBS" "$(nproc) CPUs" >"$out/.build-time"
rm -rf "${KCACHE:?}/$release"
mv "$out" "$KCACHE/$release"
touch "$KCACHE/$release/.complete"
log "built $release: $(cat "$KCACHE/$release/.build-time")"
cd /
[ -n "${KEEP_BUILD:-}" ] || rm -rf "$BUILD"
echo "$release"
exit 0
}
