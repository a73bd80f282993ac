package bypass

import (
	"encoding/csv"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/lab/bench"
)

// testSetup is the setup column of writeRaw's files.
const testSetup = "ipv4 phase=100ms"

// writeRaw writes a --raw file of one run of --pair pair in testSetup: for
// each row (path, metric, effect in percent of B against A), 10 blocks of
// 20 quads around A = 20 with 1% noise per phase.
func writeRaw(t *testing.T, dir, pair string, run int, rows [][3]string) string {
	t.Helper()
	return writeRawSetup(t, dir, pair, testSetup, run, rows)
}

// writeRawSetup is writeRaw in setup.
func writeRawSetup(t *testing.T, dir, pair, setup string, run int, rows [][3]string) string {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-run%d.csv", pair, strings.ReplaceAll(setup, " ", "_"), run))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := csv.NewWriter(f)
	w.Write(rawHeader)
	r := rand.New(rand.NewPCG(uint64(run), 5))
	for blk := range 10 {
		for _, row := range rows {
			eff, _ := strconv.ParseFloat(row[2], 64)
			for q := range 20 {
				for _, s := range bench.QuadOrder(q) {
					v := 20 * (1 + 0.01*r.NormFloat64())
					if s != bench.SideA {
						v *= 1 + eff/100
					}
					w.Write([]string{pair, setup, "host-gw", row[0], row[1], strconv.Itoa(blk), strconv.Itoa(q), s.String(), strconv.FormatFloat(v, 'g', -1, 64)})
				}
			}
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPoolRaw: three runs' --raw files pooled, each target judged on the
// pooled interval: met where the effect is past the target, missed where
// it is short of it.
func TestPoolRaw(t *testing.T) {
	dir := t.TempDir()
	rows := [][3]string{{"same-node", "udp-rtt-us", "-27"}, {"cross-node", "tcp-rtt-us", "-18"}, {"cross-node", "tcp-stream-gbps", "+15"}, {"cross-node", "udp-rtt-us", "-30"}}
	var files []string
	for run := range 3 {
		files = append(files, writeRaw(t, dir, PairBypass, run+1, rows))
	}
	checkPooled(t, files, map[string]string{"same-node udp-rtt-us": bench.Pass, "cross-node tcp-rtt-us": bench.Miss, "cross-node tcp-stream-gbps": bench.Pass, "cross-node udp-rtt-us": "-"})
}

// TestPoolRawIdle: runs of an idle pair are judged on the idle agent's
// target, every round trip at most +2% on the pooled interval's upper end;
// the report names the pair and the runs' setup.
func TestPoolRawIdle(t *testing.T) {
	dir := t.TempDir()
	rows := [][3]string{{"same-node", "tcp-rtt-us", "+0.5"}, {"same-node", "udp-rtt-us", "+3"}, {"cross-node", "tcp-rtt-us", "-1"}}
	var files []string
	for run := range 3 {
		files = append(files, writeRaw(t, dir, PairIdleUnselected, run+1, rows))
	}
	out := checkPooled(t, files, map[string]string{"same-node tcp-rtt-us": bench.Pass, "same-node udp-rtt-us": bench.Miss, "cross-node tcp-rtt-us": bench.Pass})
	if !strings.Contains(out, "the idle agent (--pair idle-unselected) vs no agent") || !strings.Contains(out, "; "+testSetup+"): ") || !strings.Contains(out, "at most +2%, upper end") {
		t.Errorf("the report does not say what was paired, or the idle target:\n%s", out)
	}
}

// checkPooled pools files and checks each row's agreement and verdict
// (rows: "path metric"); it returns the report.
func checkPooled(t *testing.T, files []string, want map[string]string) string {
	t.Helper()
	var out strings.Builder
	if err := PoolRaw(files, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	got := map[string][]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
			cells = append(cells, strings.TrimSpace(c))
		}
		if len(cells) == 12 && cells[0] == "host-gw" {
			got[cells[1]+" "+cells[2]] = cells
		}
	}
	for row, verdict := range want {
		c := got[row]
		if c == nil || c[6] != "yes" || c[11] != verdict {
			t.Errorf("%s: %q, want agreement and %s", row, c, verdict)
		}
	}
	return out.String()
}

// TestPoolRawRefused: what is not a set of runs of one command is refused,
// naming the file (and line) at fault.
func TestPoolRawRefused(t *testing.T) {
	dir := t.TempDir()
	one := writeRaw(t, dir, PairBypass, 1, [][3]string{{"same-node", "udp-rtt-us", "-27"}})
	other := writeRaw(t, dir, PairBypass, 2, [][3]string{{"same-node", "tcp-rtt-us", "-27"}})
	idle := writeRaw(t, dir, PairIdle, 3, [][3]string{{"same-node", "udp-rtt-us", "-27"}})
	v6 := writeRawSetup(t, dir, PairBypass, "ipv6 phase=100ms", 4, [][3]string{{"same-node", "udp-rtt-us", "-27"}})
	bad := filepath.Join(dir, "bad.csv")
	os.WriteFile(bad, []byte(strings.Join(rawHeader, ",")+"\nbypass,ipv4 phase=100ms,host-gw,same-node,udp-rtt-us,0,0,C,20\n"), 0o644)
	badPair := filepath.Join(dir, "badpair.csv")
	os.WriteFile(badPair, []byte(strings.Join(rawHeader, ",")+"\nidler,ipv4 phase=100ms,host-gw,same-node,udp-rtt-us,0,0,A,20\n"), 0o644)
	mixed := filepath.Join(dir, "mixed.csv")
	os.WriteFile(mixed, []byte(strings.Join(rawHeader, ",")+"\nidle,ipv4 phase=100ms,host-gw,same-node,udp-rtt-us,0,0,A,20\nbypass,ipv4 phase=100ms,host-gw,same-node,udp-rtt-us,0,0,B,20\n"), 0o644)
	mixedSetup := filepath.Join(dir, "mixedsetup.csv")
	os.WriteFile(mixedSetup, []byte(strings.Join(rawHeader, ",")+"\nbypass,ipv4 phase=100ms,host-gw,same-node,udp-rtt-us,0,0,A,20\nbypass,ipv4 phase=100ms tc-hooks-on,host-gw,same-node,udp-rtt-us,0,0,B,20\n"), 0o644)
	noSetup := filepath.Join(dir, "nosetup.csv")
	os.WriteFile(noSetup, []byte(strings.Join(rawHeader, ",")+"\nbypass,,host-gw,same-node,udp-rtt-us,0,0,A,20\n"), 0o644)
	old := filepath.Join(dir, "old.csv")
	os.WriteFile(old, []byte("pair,mode,path,metric,block,quad,side,value\nbypass,host-gw,same-node,udp-rtt-us,0,0,A,20\n"), 0o644)
	notRaw := filepath.Join(dir, "not.csv")
	os.WriteFile(notRaw, []byte("a,b\n"), 0o644)
	for _, c := range []struct {
		files []string
		want  string
	}{
		{[]string{one}, "at least 2 runs, got 1"},
		{[]string{one, other}, "have other rows"},
		{[]string{one, idle}, "-run1.csv paired bypass, " + idle + " paired idle"},
		{[]string{one, badPair}, `badpair.csv:2: pair "idler" is not`},
		{[]string{one, mixed}, "mixed.csv:3: pair bypass after idle"},
		{[]string{one, v6}, `-run1.csv ran with "ipv4 phase=100ms", ` + v6 + ` with "ipv6 phase=100ms": pool runs of one command`},
		{[]string{one, mixedSetup}, `mixedsetup.csv:3: setup "ipv4 phase=100ms tc-hooks-on" after "ipv4 phase=100ms"`},
		{[]string{one, noSetup}, "nosetup.csv:2: no setup"},
		{[]string{one, old}, "old.csv: not a bench bypass --raw file (its first line is not pair,setup,mode"},
		{[]string{one, bad}, "bad.csv:2: bad phase"},
		{[]string{one, notRaw}, "not.csv: not a bench bypass --raw file"},
		{[]string{one, filepath.Join(dir, "missing.csv")}, "missing.csv: no such file"},
	} {
		err := PoolRaw(c.files, new(strings.Builder))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error with %q", c.files, err, c.want)
		}
	}
}
