package agent

import (
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/metrics"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// adopter runs adoption rounds beside the agent's loop: a round visits
// every pod's namespace (about 25 ms each in the e2e tests here), so 500
// pods would take longer than the health check allows the loop to stall.
// One round runs at a time (the idle token); stop takes the token back for
// good, so no round runs once the datapath is closed.
type adopter struct {
	cfg          Config
	dp           *datapath.Datapath
	part         parts.Status // adoption on this kernel
	idle         chan struct{}
	stopOnce     sync.Once
	warnedDenied bool
	// The last round's CPU time (the agent's, while it ran) and its end:
	// written by the round before it hands the idle token back.
	lastCPU time.Duration
	lastEnd time.Time
}

// roundCPUShare spaces the rounds of --adopt-interval: one starts only
// when roundCPUShare times the last round's CPU time has passed since it
// ended, so the scan of a node's sockets (every socket of every pod: two
// million at a million connections) never takes more than 1/roundCPUShare
// of a CPU. The rounds at start and on request run whenever asked.
const roundCPUShare = 20

// due says whether a round for why may start at now.
func (a *adopter) due(why string, now time.Time) bool {
	return why != "interval" || now.Sub(a.lastEnd) >= roundCPUShare*a.lastCPU
}

func newAdopter(cfg Config, dp *datapath.Datapath, rep parts.Report) *adopter {
	a := &adopter{cfg: cfg, dp: dp, idle: make(chan struct{}, 1)}
	a.part, _ = rep.Get(parts.Adoption)
	a.idle <- struct{}{}
	return a
}

// round starts a round unless one runs (that one serves the request).
func (a *adopter) round(why string) {
	if !a.cfg.Adopt {
		slog.Info("adoption is off (--adopt=false): nothing done", "trigger", why)
		return
	}
	if !a.part.Runs {
		slog.Info("adoption is off on this kernel: nothing done", "trigger", why, "reason", a.part.Reason)
		return
	}
	select {
	case <-a.idle:
	default:
		return // a round is running; this request is served by it
	}
	if !a.due(why, time.Now()) {
		slog.Debug("adoption round postponed: the last one's CPU time spaces them", "cpu", a.lastCPU, "share", roundCPUShare)
		a.idle <- struct{}{}
		return
	}
	go func() {
		defer func() { a.idle <- struct{}{} }()
		cpu0 := metrics.CPUTime(unix.RUSAGE_SELF)
		rep, err := a.dp.Adopt(a.cfg.Cgroups)
		cpu := metrics.CPUTime(unix.RUSAGE_SELF) - cpu0
		a.lastCPU, a.lastEnd = cpu, time.Now()
		if err != nil {
			slog.Warn("adoption round", "err", err)
		}
		if rep.Denied > 0 && !a.warnedDenied {
			a.warnedDenied = true
			slog.Warn("adoption cannot open the network namespace of some processes of the managed cgroups: it needs CAP_SYS_ADMIN, CAP_SYS_PTRACE and the host PID namespace (chart: adoption.enabled=true)", "processes", rep.Denied)
		}
		// A round of more than a second of CPU is told: it spaces the next.
		if rep.Adopted > 0 || len(rep.Skipped) > 0 || why != "interval" || cpu >= time.Second {
			slog.Info("adoption round", "trigger", why, "namespaces", rep.Namespaces, "sockets", rep.Sockets,
				"candidates", rep.Candidates, "adopted", rep.Adopted, "skipped", rep.Skipped, "took", rep.Took, "cpu", cpu)
		}
	}()
}

// stop waits for a round in progress and lets no other start; safe to
// call twice.
func (a *adopter) stop() {
	a.stopOnce.Do(func() { <-a.idle })
}
