package main

import (
	"bufio"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// demoInstallArgs returns the arguments make demo passes to
// scripts/install-deps.sh, read from the Makefile's demo recipe.
func demoInstallArgs(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	target := regexp.MustCompile(`^([A-Za-z0-9_-]+):`)
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if m := target.FindStringSubmatch(line); m != nil {
			in = m[1] == "demo"
			continue
		}
		if in {
			if _, args, ok := strings.Cut(line, "./scripts/install-deps.sh"); ok {
				return strings.Fields(args)
			}
		}
	}
	t.Fatal("the Makefile's demo recipe does not run ./scripts/install-deps.sh")
	return nil
}

// haproxyPID is the pid of the haproxy service (its init script's pid
// file), 0 when it does not run.
func haproxyPID() int {
	for _, f := range []string{"/run/haproxy.pid", "/var/run/haproxy.pid"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if syscall.Kill(pid, 0) == nil && !zombie(pid) {
			return pid
		}
	}
	return 0
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || len(s) < i+3 || s[i+2] == 'Z'
}

// TestInstallDepsKeepsServices: a packaged daemon running before make demo's
// install step still runs after it, the same process (install-deps once
// stopped and disabled haproxy, nginx, redis-server, etcd and containerd
// on every run, installed by it or not). haproxy's service (package
// haproxy, in the demo's groups) stands for them: Debian's default
// configuration listens on no port.
func TestInstallDepsKeepsServices(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (sudo make test): it starts the haproxy service")
	}
	args := demoInstallArgs(t)
	ctx := context.Background()
	before := haproxyPID()
	if before == 0 {
		out, err := sysexec.Command(ctx, "service", "haproxy", "start").CombinedOutput()
		if err != nil {
			t.Fatalf("service haproxy start: %v\n%s", err, out)
		}
		t.Cleanup(func() {
			if out, err := sysexec.Command(context.Background(), "service", "haproxy", "stop").CombinedOutput(); err != nil {
				t.Errorf("service haproxy stop: %v\n%s", err, out)
			}
		})
		before = haproxyPID()
		if before == 0 {
			t.Fatal("service haproxy start: no haproxy process found by its pid file")
		}
	} else {
		t.Logf("the host's haproxy service already runs (pid %d): checked, left running", before)
	}
	cmd := sysexec.Command(ctx, "bash", append([]string{"../install-deps.sh"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install-deps.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if after := haproxyPID(); after != before {
		t.Fatalf("haproxy ran as pid %d before install-deps.sh %s, %d after (0: stopped)", before, strings.Join(args, " "), after)
	}
}

// TestInstallDepsGroups: an unknown group is refused, naming it.
func TestInstallDepsGroups(t *testing.T) {
	out, err := sysexec.Command(context.Background(), "bash", "../install-deps.sh", "lab", "bogus").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown group bogus") {
		t.Fatalf("install-deps.sh lab bogus: %v, want an error naming bogus:\n%s", err, out)
	}
}
