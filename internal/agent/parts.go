package agent

import (
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/kernelinfo"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// partsReport is what runs on this node: every family's parts, and the kernel.
func partsReport(dp *datapath.Datapath) parts.Report {
	rep := dp.Parts()
	rep.Kernel = kernelinfo.Release()
	return rep
}

// logParts logs each part: on, or off with its reason.
func logParts(rep parts.Report) {
	for _, s := range rep.Sorted() {
		if s.Runs {
			slog.Info("part runs", "part", s.Part, "via", s.Via)
		} else {
			slog.Warn("part off", "part", s.Part, "reason", s.Reason)
		}
	}
}

// bypassReporter writes each change of the bypass's standby and idle
// devices into the parts report `eztunnel status` reads (a copy of rep of
// its own).
func bypassReporter(rep parts.Report, path string) func(standby string, idle map[string]string) {
	rep.Parts = slices.Clone(rep.Parts)
	var mu sync.Mutex
	return func(standby string, idle map[string]string) {
		mu.Lock()
		defer mu.Unlock()
		st, ok := rep.Get(parts.Bypass)
		if !ok {
			return
		}
		st.Standby, st.Idle = standby, maps.Clone(idle)
		rep.Set(st)
		if err := rep.Write(path); err != nil {
			slog.Warn("cannot write the parts report `eztunnel status` reads", "err", err)
		}
	}
}
