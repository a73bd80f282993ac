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

// writeRaw writes a --raw file of one run: for each row (path, metric,
// effect in percent of B against A), 10 blocks of 20 quads around A = 20
// with 1% noise per phase.
func writeRaw(t *testing.T, dir string, run int, rows [][3]string) string {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("run%d.csv", run))
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
					w.Write([]string{"host-gw", row[0], row[1], strconv.Itoa(blk), strconv.Itoa(q), s.String(), strconv.FormatFloat(v, 'g', -1, 64)})
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
		files = append(files, writeRaw(t, dir, run+1, rows))
	}
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
	for row, verdict := range map[string]string{"same-node udp-rtt-us": bench.Pass, "cross-node tcp-rtt-us": bench.Miss, "cross-node tcp-stream-gbps": bench.Pass, "cross-node udp-rtt-us": "-"} {
		c := got[row]
		if c == nil || c[6] != "yes" || c[11] != verdict {
			t.Errorf("%s: %q, want agreement and %s", row, c, verdict)
		}
	}
}

// TestPoolRawRefused: what is not a set of runs of one command is refused,
// naming the file (and line) at fault.
func TestPoolRawRefused(t *testing.T) {
	dir := t.TempDir()
	one := writeRaw(t, dir, 1, [][3]string{{"same-node", "udp-rtt-us", "-27"}})
	other := writeRaw(t, dir, 2, [][3]string{{"same-node", "tcp-rtt-us", "-27"}})
	bad := filepath.Join(dir, "bad.csv")
	os.WriteFile(bad, []byte(strings.Join(rawHeader, ",")+"\nhost-gw,same-node,udp-rtt-us,0,0,C,20\n"), 0o644)
	notRaw := filepath.Join(dir, "not.csv")
	os.WriteFile(notRaw, []byte("a,b\n"), 0o644)
	for _, c := range []struct {
		files []string
		want  string
	}{
		{[]string{one}, "at least 2 runs, got 1"},
		{[]string{one, other}, "have other rows"},
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
