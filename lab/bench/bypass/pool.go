package bypass

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/eztunnel/eztunnel/lab/bench"
)

// Pooling the runs of bench bypass --pairs --raw: each run's intervals,
// whether they agree, how far the runs differ beyond them (bench.PoolRuns)
// and issue 37's targets judged on the interval that holds across the runs.

// rawRow is a row of --raw: mode, path and metric (pairedKind.rawName).
type rawRow struct{ mode, path, metric string }

// rawRun is one --raw file: what it paired (--pair) in which setup
// (rawSetup), each row's phases by side and block, and the rows in the
// order the file has them.
type rawRun struct {
	pair  string
	setup string
	rows  map[rawRow]*[4][][]float64
	order []rawRow
}

// readRaw reads a file bench bypass --raw wrote.
func readRaw(path string) (rawRun, error) {
	f, err := os.Open(path)
	if err != nil {
		return rawRun{}, err
	}
	defer f.Close()
	cr := csv.NewReader(f)
	cr.FieldsPerRecord = len(rawHeader)
	head, err := cr.Read()
	if err != nil || !slices.Equal(head, rawHeader) {
		return rawRun{}, fmt.Errorf("%s: not a bench bypass --raw file (its first line is not %s)", path, strings.Join(rawHeader, ","))
	}
	sides := map[string]bench.Side{}
	for s := bench.SideAA1; s <= bench.SideB; s++ {
		sides[s.String()] = s
	}
	run := rawRun{rows: map[rawRow]*[4][][]float64{}}
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return rawRun{}, fmt.Errorf("%s: %w", path, err)
		}
		switch {
		case !slices.Contains([]string{PairBypass, PairIdle, PairIdleNarrow, PairIdleUnselected}, rec[0]):
			return rawRun{}, fmt.Errorf("%s:%d: pair %q is not %s, %s, %s or %s", path, line, rec[0], PairBypass, PairIdle, PairIdleNarrow, PairIdleUnselected)
		case run.pair != "" && rec[0] != run.pair:
			return rawRun{}, fmt.Errorf("%s:%d: pair %s after %s: one file holds one run", path, line, rec[0], run.pair)
		case rec[1] == "":
			return rawRun{}, fmt.Errorf("%s:%d: no setup (the run's address family, phase and switches)", path, line)
		case run.setup != "" && rec[1] != run.setup:
			return rawRun{}, fmt.Errorf("%s:%d: setup %q after %q: one file holds one run", path, line, rec[1], run.setup)
		}
		run.pair, run.setup = rec[0], rec[1]
		k := rawRow{rec[2], rec[3], rec[4]}
		blk, err1 := strconv.Atoi(rec[5])
		v, err2 := strconv.ParseFloat(rec[8], 64)
		s, ok := sides[rec[7]]
		if err1 != nil || err2 != nil || !ok || blk < 0 || blk > 10000 || !(v > 0) {
			return rawRun{}, fmt.Errorf("%s:%d: bad phase %q (want a block number, a side A, B, AA1 or AA2, and a value above 0)", path, line, strings.Join(rec, ","))
		}
		q := run.rows[k]
		if q == nil {
			q = &[4][][]float64{}
			run.rows[k] = q
			run.order = append(run.order, k)
		}
		for len(q[s]) <= blk {
			q[s] = append(q[s], nil)
		}
		q[s][blk] = append(q[s][blk], v)
	}
	if len(run.order) == 0 {
		return rawRun{}, fmt.Errorf("%s: no phases", path)
	}
	return run, nil
}

// phases are row k's A/B (aa false) or A/A phases as bench.PoolRuns takes
// them, seeded as the run seeded them (quadsSeed).
func (r rawRun) phases(k rawRow, aa bool) bench.RunPhases {
	q := r.rows[k]
	if aa {
		return bench.RunPhases{A: q[bench.SideAA1], B: q[bench.SideAA2], Seed: quadsSeed(q)}
	}
	return bench.RunPhases{A: q[bench.SideA], B: q[bench.SideB], Seed: quadsSeed(q)}
}

// poolTarget is issue 37's target for a row: the pooled interval's upper
// end at or below limit (atLeast false) or its lower end at or above it,
// and the median at or below median (when set).
type poolTarget struct {
	limit, median float64
	atLeast       bool
	text          string
}

// poolTargets are the bypass's (--pair bypass), by path and metric.
var poolTargets = map[[2]string]poolTarget{
	{crossNode, tcpRTT.rawName()}:    {limit: -15, median: -20, text: "-20%, upper end at or below -15%"},
	{"same-node", udpRTT.rawName()}:  {limit: -25, text: "-25%, upper end at or below -25%"},
	{crossNode, tcpStream.rawName()}: {limit: 0, atLeast: true, text: "not below the bridge (lower end at or above 0)"},
}

// PoolRaw reads the --raw files of two or more runs of bench bypass --pairs
// and writes, for each row the files share, each run's A/B interval, whether
// they agree, the spread between the runs, and the pooled A/B and A/A
// intervals, with issue 37's target judged on the pooled interval.
func PoolRaw(files []string, w io.Writer) error {
	if len(files) < 2 {
		return fmt.Errorf("pooling needs the --raw files of at least 2 runs, got %d", len(files))
	}
	var runs []rawRun
	for _, f := range files {
		r, err := readRaw(f)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	for i, r := range runs[1:] {
		if r.pair != runs[0].pair {
			return fmt.Errorf("%s paired %s, %s paired %s: pool runs of one command", files[0], runs[0].pair, files[i+1], r.pair)
		}
		if r.setup != runs[0].setup {
			return fmt.Errorf("%s ran with %q, %s with %q: pool runs of one command", files[0], runs[0].setup, files[i+1], r.setup)
		}
		if !slices.Equal(r.order, runs[0].order) {
			return fmt.Errorf("%s and %s have other rows (%v; %v): pool runs of one command", files[0], files[i+1], runs[0].order, r.order)
		}
	}
	var out [][]string
	for _, k := range runs[0].order {
		row, err := poolRow(runs, k)
		if err != nil {
			return fmt.Errorf("%s %s %s: %w", k.mode, k.path, k.metric, err)
		}
		out = append(out, row)
	}
	what := "bypass vs kernel path"
	if runs[0].pair != PairBypass {
		what = "the idle agent (--pair " + runs[0].pair + ") vs no agent"
	}
	fmt.Fprintf(w, "%d runs pooled (%s; %s): each run's A/B interval (%s, as it printed it); agree: all share a point; between runs: the standard deviation of the effect beyond the runs' own errors (tau, points) and its share of their spread (I²); pooled: the random-effects estimate across the runs with its 95%% interval (DerSimonian-Laird, Hartung-Knapp: a t quantile with %d degrees of freedom), the same for the A/A rows; a row judges only if its pooled A/A interval holds 0 and is within ±%.0f%%\n\n",
		len(files), strings.Join(files, ", "), runs[0].setup, what, len(files)-1, bench.AAMaxHalfWidth)
	head := []string{"mode", "path", "metric"}
	for i := range files {
		head = append(head, fmt.Sprintf("run %d", i+1))
	}
	head = append(head, "agree", "between runs", "pooled A/B", "pooled A/A", "target (issue 37)", "verdict")
	var b strings.Builder
	bench.WriteTable(&b, head, out)
	_, err := io.WriteString(w, b.String())
	return err
}

// poolRow is the report's row for k.
func poolRow(runs []rawRun, k rawRow) ([]string, error) {
	var ab, aa []bench.RunPhases
	for _, r := range runs {
		ab, aa = append(ab, r.phases(k, false)), append(aa, r.phases(k, true))
	}
	pab, err := bench.PoolRuns(ab)
	if err != nil {
		return nil, fmt.Errorf("A/B: %w", err)
	}
	paa, err := bench.PoolRuns(aa)
	if err != nil {
		return nil, fmt.Errorf("A/A: %w", err)
	}
	row := []string{k.mode, k.path, k.metric}
	for _, r := range pab.Runs {
		row = append(row, r.String())
	}
	agree := "yes"
	if !pab.Agree {
		agree = "no"
	}
	row = append(row, agree, fmt.Sprintf("tau %.1f, I² %.0f%%", pab.Tau, 100*pab.I2), pab.Paired().String(), paa.Paired().String())
	t, ok := poolTargets[[2]string{k.path, k.metric}]
	if runs[0].pair != PairBypass {
		// The idle agent's: every round trip at most idleTarget.
		t, ok = poolTarget{limit: idleTarget, text: fmt.Sprintf("at most %+.0f%%, upper end", idleTarget)}, k.metric != tcpStream.rawName()
	}
	if !ok {
		return append(row, "-", "-"), nil
	}
	if judged := bench.JudgedCell(paa.Paired()); judged != "yes" {
		return append(row, t.text, bench.NotJudged+" ("+strings.TrimPrefix(judged, "no: ")+")"), nil
	}
	verdict, _ := bench.Judge(pab.Paired(), paa.Paired(), t.limit, t.atLeast)
	if verdict == bench.Pass && t.median != 0 && pab.Median > t.median {
		verdict = bench.Miss
	}
	return append(row, t.text, verdict), nil
}
