package agent

import (
	"log/slog"
	"sync"

	"github.com/eztunnel/eztunnel/internal/datapath"
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
	go func() {
		defer func() { a.idle <- struct{}{} }()
		rep, err := a.dp.Adopt(a.cfg.Cgroups)
		if err != nil {
			slog.Warn("adoption round", "err", err)
		}
		if rep.Denied > 0 && !a.warnedDenied {
			a.warnedDenied = true
			slog.Warn("adoption cannot open the network namespace of some processes of the managed cgroups: it needs CAP_SYS_ADMIN, CAP_SYS_PTRACE and the host PID namespace (chart: adoption.enabled=true)", "processes", rep.Denied)
		}
		if rep.Adopted > 0 || len(rep.Skipped) > 0 || why != "interval" {
			slog.Info("adoption round", "trigger", why, "namespaces", rep.Namespaces, "sockets", rep.Sockets,
				"candidates", rep.Candidates, "adopted", rep.Adopted, "skipped", rep.Skipped, "took", rep.Took)
		}
	}()
}

// stop waits for a round in progress and lets no other start; safe to
// call twice.
func (a *adopter) stop() {
	a.stopOnce.Do(func() { <-a.idle })
}
