// Command promql parses PromQL expressions with Prometheus' own parser, for
// the chart's tests (deploy, test/e2e): each line of stdin is one
// expression, JSON-quoted; each line of stdout is a JSON object with the
// metric names its vector selectors name (sorted, deduplicated) or the
// parser's error. It exits 0 when every expression parsed. Grafana's
// variables ($__rate_interval, $instance, ...) must be substituted first.
// Its own module so the agent's go.mod does not pull Prometheus in.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/prometheus/promql/parser"
)

type result struct {
	Expr    string   `json:"expr"`
	Metrics []string `json:"metrics,omitempty"`
	Error   string   `json:"error,omitempty"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	failed := false
	for in.Scan() {
		var expr string
		if err := json.Unmarshal(in.Bytes(), &expr); err != nil {
			fmt.Fprintln(os.Stderr, "promql: a line is not a JSON string:", err)
			os.Exit(2)
		}
		r := parse(expr)
		failed = failed || r.Error != ""
		if err := out.Encode(r); err != nil {
			os.Exit(2)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "promql:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// parse parses expr and lists the metric names of its vector selectors.
func parse(expr string) result {
	r := result{Expr: expr}
	e, err := parser.ParseExpr(expr)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	seen := map[string]bool{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" && !seen[vs.Name] {
			seen[vs.Name] = true
			r.Metrics = append(r.Metrics, vs.Name)
		}
		return nil
	})
	sort.Strings(r.Metrics)
	return r
}
