package mesh

import (
	"context"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// Facts describe the machine and the options of a lab run (machine.json).
type Facts struct {
	Started  time.Time         `json:"started"`
	Kernel   string            `json:"kernel"`
	CPUs     int               `json:"cpus"`
	CPUModel string            `json:"cpu_model"`
	MemTotal float64           `json:"mem_total_mb"`
	Go       string            `json:"go"`
	Versions map[string]string `json:"versions"`
	Options  Options           `json:"options"`
}

func collectFacts(o Options) Facts {
	f := Facts{Started: time.Now().UTC(), CPUs: runtime.NumCPU(), Go: runtime.Version(), Options: o,
		Versions: map[string]string{}}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		f.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				f.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb float64
				for _, c := range strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")) {
					kb = kb*10 + float64(c-'0')
				}
				f.MemTotal = kb / 1024
			}
		}
	}
	for name, argv := range map[string][]string{
		"haproxy":         {"haproxy", "-v"},
		"redis-server":    {"redis-server", "--version"},
		"redis-benchmark": {"redis-benchmark", "--version"},
		"nginx":           {"nginx", "-v"},
		"wrk":             {"wrk", "--version"},
		"iptables":        {"iptables", "--version"},
	} {
		out, _ := sysexec.Command(context.Background(), argv[0], argv[1:]...).CombinedOutput()
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		f.Versions[name] = line
	}
	return f
}
