package scale

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/eztunnel/eztunnel/lab/bench"
)

// Table is the report as a Markdown table, one row per step, then the
// goals against the first step and what ended the run.
func Table(rep Report) string {
	var b strings.Builder
	if rep.CPUs > 0 {
		fmt.Fprintf(&b, "agent %s, bench %s; %d CPUs, %s; RLIMIT_NOFILE %d (fs.nr_open %d); MemTotal %.1f GiB\n\n",
			rep.Agent, rep.Lab, rep.CPUs, rep.CPUPlacement, rep.Nofile, rep.NrOpen, gib(rep.MemTotal))
	}
	header := []string{"connections", "processes/side", "setup/s", "probe RTT p50 µs", "CPU µs/msg", "plain CPU µs/msg", "gauge CPU µs/msg", "CPU vs plain [95% CI]", "CPU A/A [95% CI]", "programs ns/msg",
		"agent idle CPU %", "agent RSS MB", "BPF maps MB", "agent B/conn", "node KB/conn", "listing s", "scrape s", "uninstall s", "exact"}
	var rows [][]string
	for _, s := range rep.Steps {
		exact, listing := "yes", bench.Num(s.ListingSeconds, 2)
		if s.ListingError != "" {
			listing = "failed"
		}
		if !s.Exact {
			exact = "no"
		}
		rows = append(rows, []string{strconv.Itoa(s.Conns), strconv.Itoa(s.Procs), bench.Num(s.SetupRate, 0), bench.Num(s.RTT.P50, 1),
			bench.Num(s.CPUPerMsg, 2), bench.Num(s.PlainCPUPerMsg, 2), bench.Num(s.GaugeCPUPerMsg, 2), s.CPUVsPlain.Cell(), s.CPUAA.Cell(), bench.Num(s.ProgNsPerMsg, 0), bench.Num(100*s.AgentIdleCPU, 1), bench.Num(mb(s.AgentRSS), 1), bench.Num(mb(s.MapBytes), 1), bench.Num(s.AgentBytesPerConn, 0),
			bench.Num(s.NodeBytesPerConn/1000, 1), listing, bench.Num(s.ScrapeSeconds, 3), bench.Num(s.UninstallSeconds, 2), exact})
	}
	bench.WriteTable(&b, header, rows)
	if len(rep.Steps) > 1 {
		first, last := rep.Steps[0], rep.Steps[len(rep.Steps)-1]
		fmt.Fprintf(&b, "\nat %d connections against %d: setup rate %s, CPU per message %s, the programs' time per message %s, probe RTT p50 %s\n", last.Conns, first.Conns,
			bench.WithUnit(100*(bench.Ratio(last.SetupRate, first.SetupRate)-1), "%"), bench.WithUnit(100*(bench.Ratio(last.CPUPerMsg, first.CPUPerMsg)-1), "%"),
			bench.WithUnit(100*(bench.Ratio(last.ProgNsPerMsg, first.ProgNsPerMsg)-1), "%"), bench.WithUnit(100*(bench.Ratio(last.RTT.P50, first.RTT.P50)-1), "%"))
		b.WriteString(cpuGoal(first, last))
		b.WriteString(progGoal(first, last))
	}
	for _, s := range rep.Steps {
		if s.ListingError != "" {
			fmt.Fprintf(&b, "listing of %d connections failed after %.1f s: %s; from the pins: %d ends in %.1f s\n", s.Conns, s.ListingSeconds, s.ListingError, s.FromPinsEnds, s.FromPinsSeconds)
		}
		if s.UninstallError != "" {
			fmt.Fprintf(&b, "uninstall of %d connections: %s\n", s.Conns, s.UninstallError)
		}
		for _, r := range s.Rounds {
			if r.FirstError != "" {
				fmt.Fprintf(&b, "%d connections, round %d: %d mismatched, %d failed; first: %s\n", s.Conns, r.Round, r.Mismatches, r.Errors, r.FirstError)
			}
		}
	}
	if rep.EndedBy != "" {
		fmt.Fprintf(&b, "\nstep of %d connections not held: %s\n", rep.EndedAt, rep.EndedBy)
	}
	return b.String()
}

// cpuGoal judges the goal "CPU per message at the last step within 10% of
// the first": the shortcut's runs over their gauge runs (probe.go: the
// host's drift divided out) of both steps, compared by their medians
// (bench.CompareMedians: the steps are minutes apart, so not paired), met
// when the interval's upper end is at most +10%. Judged only when both
// steps' A/A intervals are valid. Beside it: the same for plain TCP, and
// the shortcut's CPU per message undivided (which the drift moves).
func cpuGoal(first, last Row) string {
	seed := uint64(last.Conns)
	ch, err := bench.CompareMedians(first.CPUOverGauge, last.CPUOverGauge, seed)
	if err != nil {
		return fmt.Sprintf("CPU per message within %.0f%%: %s (%v)\n", cpuLimit, bench.NotJudged, err)
	}
	cell := func(a, b []float64, seed uint64) string {
		p, err := bench.CompareMedians(a, b, seed)
		if err != nil {
			return "-"
		}
		return p.String()
	}
	verdict := judgeSteps(ch, first, last)
	return fmt.Sprintf("CPU per message over the gauge's, at %d connections against %d: shortcut %s, plain TCP %s (undivided: shortcut %s, plain %s, gauge %s); within %+.0f%%: %s\n",
		last.Conns, first.Conns, ch, cell(first.PlainOverGauge, last.PlainOverGauge, seed+1),
		cell(first.CPUPerMsgRuns, last.CPUPerMsgRuns, seed+2), cell(first.PlainCPUPerMsgRuns, last.PlainCPUPerMsgRuns, seed+3),
		bench.WithUnit(100*(bench.Ratio(last.GaugeCPUPerMsg, first.GaugeCPUPerMsg)-1), "%"), cpuLimit, verdict)
}

// cpuLimit: the goal for CPU per message at a million connections, in
// percent of the first step's.
const cpuLimit = 10.0

// progGoal compares the programs' time per message at the last step with
// the first's, over the gauge (the host's drift divided out) and undivided,
// by medians with bootstrap intervals, against the same 10%. The
// statistics runs have no A/A pair of their own: judged only when both
// steps' probe A/A intervals are valid.
func progGoal(first, last Row) string {
	seed := uint64(last.Conns) + 7
	ch, err := bench.CompareMedians(first.ProgOverGauge, last.ProgOverGauge, seed)
	if err != nil {
		return fmt.Sprintf("programs' time per message within %.0f%%: %s (%v)\n", cpuLimit, bench.NotJudged, err)
	}
	undivided := "-"
	if p, err := bench.CompareMedians(first.ProgNsRuns, last.ProgNsRuns, seed+1); err == nil {
		undivided = p.String()
	}
	verdict := judgeSteps(ch, first, last)
	return fmt.Sprintf("programs' time per message over the gauge's CPU, at %d connections against %d: %s (undivided %s); within %+.0f%%: %s\n",
		last.Conns, first.Conns, ch, undivided, cpuLimit, verdict)
}

// judgeSteps judges a change between the first and the last step against
// cpuLimit, on its interval's upper end, only when both steps' A/A
// intervals are valid: the verdict, with the reason when not judged.
func judgeSteps(ch bench.Paired, first, last Row) string {
	for _, st := range []Row{first, last} {
		if v, why := bench.Judge(ch, st.CPUAA, cpuLimit, false); v == bench.NotJudged {
			return fmt.Sprintf("%s (at %d connections: %s)", v, st.Conns, why)
		}
	}
	v, _ := bench.Judge(ch, first.CPUAA, cpuLimit, false)
	return v
}
