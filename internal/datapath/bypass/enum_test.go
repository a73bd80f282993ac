package bypass

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eztunnel/eztunnel/internal/parts"
)

// kindConsts returns the string constants of the Go package in dir whose
// names start with one of prefixes, by name.
func kindConsts(t *testing.T, dir string, prefixes ...string) map[string]string {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			ast.Inspect(f, func(n ast.Node) bool {
				vs, ok := n.(*ast.ValueSpec)
				if !ok {
					return true
				}
				for i, id := range vs.Names {
					if i >= len(vs.Values) {
						break
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if ok && lit.Kind == token.STRING && slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(id.Name, p) }) {
						out[id.Name] = strings.Trim(lit.Value, `"`)
					}
				}
				return true
			})
		}
	}
	return out
}

// labels collects every value of label name the collector exports.
func labels(t *testing.T, c prometheus.Collector, name string) []string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == name {
					out = append(out, mf.GetName()+"="+l.GetValue())
				}
			}
		}
	}
	return out
}

// TestReasonsEnumerated: every idle and standby kind the code declares
// (idleKind*, standbyKind*, podnet.Control*) is in IdleKinds or
// StandbyKinds, and the collector and Enabled export no reason outside
// their enumerations whatever the node reports (free text becomes other,
// an unknown code error).
func TestReasonsEnumerated(t *testing.T) {
	idle := kindConsts(t, ".", "idleKind")
	for k, v := range kindConsts(t, filepath.Join("..", "..", "podnet"), "Control") {
		idle["podnet."+k] = v
	}
	standby := kindConsts(t, ".", "standbyKind")
	if len(idle) < 7 || len(standby) < 2 {
		t.Fatalf("found idle kinds %v and standby kinds %v: the parse is broken", idle, standby)
	}
	for name, v := range idle {
		if !slices.Contains(IdleKinds, v) {
			t.Errorf("idle kind %s = %q is not in IdleKinds", name, v)
		}
	}
	for name, v := range standby {
		if !slices.Contains(StandbyKinds, v) {
			t.Errorf("standby kind %s = %q is not in StandbyKinds", name, v)
		}
	}
	kinds := map[string]string{"free": "qdisc: tbf 1: root"}
	for name, v := range idle {
		kinds[name] = v
	}
	for _, sb := range append(slices.Clone(StandbyKinds), "conntrack does not run in the node's network namespace") {
		col := newCollector(fakeBypass{counters: map[string]uint64{}, standby: sb, kinds: kinds})
		for _, l := range labels(t, col, "reason") {
			name, v, _ := strings.Cut(l, "=")
			if enum := map[string][]string{"eztunnel_bypass_standby": StandbyKinds, "eztunnel_bypass_idle_device": IdleKinds,
				"eztunnel_bypass_idle_devices": IdleKinds}[name]; !slices.Contains(enum, v) {
				t.Errorf("%s exports reason %q, not in its enumeration %v", name, v, enum)
			}
		}
	}
	for _, c := range append(slices.Clone(parts.Codes), "", "the kernel said no") {
		for _, l := range labels(t, Enabled(c), "reason") {
			if v := strings.TrimPrefix(l, "eztunnel_bypass_enabled="); v != "" && !parts.Known(parts.Code(v)) {
				t.Errorf("Enabled(%q) exports reason %q, not in parts.Codes", c, v)
			}
		}
	}
}
