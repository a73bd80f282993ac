// Package kernelinfo reads what `eztunnel preflight` and the parts report
// show of the node: the kernel release and the process's capabilities.
package kernelinfo

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Release is uname -r.
func Release() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// capNames are the capabilities eztunnel's parts use, by bit.
var capNames = map[int]string{12: "CAP_NET_ADMIN", 21: "CAP_SYS_ADMIN", 38: "CAP_PERFMON", 39: "CAP_BPF"}

// Capabilities lists the effective capabilities eztunnel uses that this
// process holds (from /proc/self/status CapEff).
func Capabilities() []string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		hex, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return nil
		}
		var out []string
		for _, bit := range []int{39, 12, 38, 21} {
			if v&(1<<bit) != 0 {
				out = append(out, capNames[bit])
			}
		}
		return out
	}
	return nil
}
