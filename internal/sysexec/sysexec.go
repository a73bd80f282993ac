// Package sysexec is the one place the repository runs external programs.
// Every program it may run is registered here with the Debian package that
// provides it, so `go run ./scripts/depcheck` can prove a fresh machine has
// them all after scripts/install-deps.sh. Command refuses names it does not
// know. Binaries the build produces (the agent, the lab) are run by path.
package sysexec

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Program is one external program and where it comes from.
type Program struct {
	Name string
	// Package is the Debian package providing it; "" for the Go toolchain,
	// which install-deps.sh checks for but does not install.
	Package string
	// Why: who runs it.
	Why string
}

// Forbidden is the program nothing here may run: our code does not depend
// on the nftables CLI (google/nftables speaks netlink). Only kube-proxy's
// nftables mode, the baseline of bench services, execs it itself (package
// nftables in install-deps.sh).
const Forbidden = "nft"

// Toolchain marks programs that come with Go, not from Debian.
const Toolchain = ""

var programs = map[string]Program{}

func register(name, pkg, why string) { programs[name] = Program{name, pkg, why} }

func init() {
	register("nsenter", "util-linux", "netlab: commands in a pod's network namespace")
	register("unshare", "util-linux", "e2e: the no-BTF case runs the agent in a private mount namespace")
	register("setpriv", "util-linux", "e2e: TestServicesNetNSUnreachable runs the agent without CAP_SYS_ADMIN")
	register("mount", "mount", "e2e: hides /sys/kernel/btf (inside unshare's sh -c)")
	register("sh", "dash", "e2e: unshare's script")
	register("cp", "coreutils", "e2e: copies the tree for the upgrade variant")
	register("go", Toolchain, "e2e: builds the binaries under test")
	register("clang-19", "clang-19", "go generate (bpf2go) in make and the upgrade test; bpftest compiles every header alone")
	register("ip", "iproute2", "e2e: a route in a pod; test/k8s: the NodePort test's external client namespace; scripts/trace-repro.sh")
	register("iptables", "iptables", "lab/e2e: kube-proxy-style DNAT, ambient capture, trace filter rules")
	register("iptables-restore", "iptables", "meshlab: Istio's capture rules in one batch, as istio-iptables; multinode: node firewalls")
	register("ip6tables-restore", "iptables", "lab/multinode: node firewalls (IPv6)")
	register("haproxy", "haproxy", "meshlab: sidecar and node proxies")
	register("nginx", "nginx", "meshlab: HTTP server")
	register("redis-server", "redis-server", "meshlab: redis server")
	register("redis-benchmark", "redis-tools", "bench lab: redis workload")
	register("wrk", "wrk", "bench lab: HTTP workload")
	register("iperf3", "iperf3", "bench bypass: TCP stream throughput and small-UDP packet rate")
	register("stress-ng", "stress-ng", "stressed benchmark runs (CPU load)")
	register("python3", "python3-minimal", "e2e eagain: a blocking Python client and the gate server (run as /usr/bin/python3; package python3 brings the stdlib)")
	register("java", "openjdk-17-jre-headless", "e2e eagain: a blocking Java client")
	register("javac", "openjdk-17-jdk-headless", "e2e eagain: compiles the Java client")
	register("curl", "curl", "e2e eagain: an HTTP client blocked on a slow first byte")
	register("redis-cli", "redis-tools", "e2e eagain: BLPOP blocked on an empty list, and the push that ends it")
	register("ss", "iproute2", "e2e eagain: waits until redis-server listens; semantics: who listens when a probe is refused")
	register("etcd", "etcd-server", "lab/k8scluster: the cluster's etcd")
	register("containerd", "containerd", "lab/k8scluster: the cluster's container runtime (runs containerd-shim-runc-v2 and runc)")
	register("ctr", "containerd", "lab/k8scluster: imports the locally built OCI images")
	register("iptables-save", "iptables", "lab/k8scluster: finds the KUBE-/CNI- chains to remove")
	register("ip6tables-save", "iptables", "lab/k8scluster: finds the KUBE-/CNI- chains to remove")
	register("ip6tables", "iptables", "lab/k8scluster: removes the KUBE-/CNI- chains; lab/multinode: FORWARD rules; e2e: kube-proxy's REJECT of an IPv6 Service without endpoints")
	register("ITGSend", "d-itg", "bench services: D-ITG sender (TCP throughput, UDP one-way latency)")
	register("ITGRecv", "d-itg", "bench services: D-ITG receiver in the backend pods")
	register("ITGDec", "d-itg", "bench services: decodes ITGSend's log")
	register("ldd", "libc-bin", "test/k8s bench: the shared libraries the redis image needs")
	// Shell scripts (scripts/*.sh) also run: flock, setsid (util-linux),
	// sed, grep, diff, mktemp, seq, head (Essential), go, ip, nsenter.
	register("flock", "util-linux", "scripts/crash-test.sh: the kernel-tests lock")
	register("setsid", "util-linux", "scripts/crash-test.sh: the killed tests' process group")
	register("dpkg", "dpkg", "depcheck: which package owns a program")
	register("dpkg-query", "dpkg", "depcheck: installed and essential packages")
	register("tar", "tar", "e2e observability: reads the bug report archive")
	register("make", "make", "test/release: runs make release")
	register("sha256sum", "coreutils", "test/release: checks the release's SHA256SUMS; scripts/release.sh writes it")
	register("bash", "bash", "depcheck's test: runs scripts/install-deps.sh")
	register("service", "init-system-helpers", "depcheck's test: starts, checks and stops a packaged daemon (systemctl where systemd runs)")
}

// Programs returns every registered program, sorted by name.
func Programs() []Program {
	out := make([]Program, 0, len(programs))
	for _, p := range programs {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Lookup returns the registration of name.
func Lookup(name string) (Program, bool) {
	p, ok := programs[name]
	return p, ok
}

// SystemDirs is where Debian packages put programs. A program registered
// with a package is run from there only, never from an earlier PATH entry
// (a pyenv shim named python3, /usr/local/bin), so what runs is the file
// depcheck proved belongs to that package.
var SystemDirs = []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// Path resolves a registered program: a Debian package's from SystemDirs,
// the Go toolchain's through PATH. A path is returned as it is.
func Path(name string) (string, error) {
	if err := Check(name); err != nil {
		return "", err
	}
	if strings.Contains(name, "/") {
		return name, nil
	}
	p := programs[name]
	if p.Package == Toolchain {
		return exec.LookPath(name)
	}
	for _, d := range SystemDirs {
		path := filepath.Join(d, name)
		if st, err := os.Stat(path); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return path, nil
		}
	}
	return "", fmt.Errorf("sysexec: %s not found in %s: install Debian package %s (scripts/install-deps.sh)", name, strings.Join(SystemDirs, ":"), p.Package)
}

// Command is exec.CommandContext for a registered program (resolved by Path)
// or a path to a binary the build made. An unknown or missing program
// yields a Cmd whose Start fails with an error naming it.
func Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	path, err := Path(name)
	if err != nil {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Err = err
		return cmd
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Args[0] = name
	return cmd
}

// Check reports whether name may be run: a registered program, or a path.
func Check(name string) error {
	if strings.Contains(name, "/") {
		return nil
	}
	if name == Forbidden {
		return fmt.Errorf("sysexec: nothing may run nft (not a dependency): use github.com/google/nftables")
	}
	if _, ok := programs[name]; !ok {
		return fmt.Errorf("sysexec: program %q is not registered in internal/sysexec with its Debian package", name)
	}
	return nil
}
