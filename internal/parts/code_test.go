package parts

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// TestCodesEnumerated: every Code constant the package declares is in
// Codes, each a short snake_case name, and Codes holds nothing else; a
// status's Label is always "" or one of Codes, whatever its Code holds.
func TestCodesEnumerated(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []Code
	for _, f := range pkgs["parts"].Files {
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "Code" {
				for _, v := range vs.Values {
					lit := v.(*ast.BasicLit)
					declared = append(declared, Code(strings.Trim(lit.Value, `"`)))
				}
			}
			return true
		})
	}
	if len(declared) < 5 {
		t.Fatalf("found %d Code constants in the package: the parse is broken", len(declared))
	}
	slices.Sort(declared)
	codes := slices.Clone(Codes)
	slices.Sort(codes)
	if !slices.Equal(declared, codes) {
		t.Errorf("declared Code constants %v, Codes %v", declared, codes)
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9_]{2,30}$`)
	for _, c := range Codes {
		if !snake.MatchString(string(c)) {
			t.Errorf("code %q is not a short snake_case name", c)
		}
	}
	for _, st := range []Status{{Runs: true}, {Code: CodeNeedsPart}, {Code: ""}, {Code: "kernel says no"}} {
		if l := st.Label(); (l != "" || !st.Runs) && !Known(Code(l)) {
			t.Errorf("Label of %+v = %q: not in Codes", st, l)
		}
	}
	if l := (Status{Code: "kernel says no"}).Label(); l != string(CodeError) {
		t.Errorf("a code not in Codes labels as %q, want error", l)
	}
}

// TestCodeOf: the kernel's refusals classify by their errors, and a code an
// error names wins over what it wraps.
func TestCodeOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Code
	}{
		{nil, ""},
		{errors.New("disk on fire"), CodeError},
		{fmt.Errorf("program x (shortcut): %w", &ebpf.VerifierError{}), CodeVerifierRejected},
		{fmt.Errorf("program x (bypass): kfunc bpf_skb_ct_lookup: %w", ebpf.ErrNotSupported), CodeKernelLacksKfunc},
		{fmt.Errorf("program x (tracer): %w", ebpf.ErrNotSupported), CodeKernelLacksFeature},
		{fmt.Errorf("load: %w", unix.EPERM), CodeNotPermitted},
		{fmt.Errorf("load: %w", unix.EACCES), CodeNotPermitted},
		{fmt.Errorf("program x: %w", WithCode(CodeKernelLacksTCX, unix.EPERM)), CodeKernelLacksTCX},
		{WithCode(CodeDisabledByFlag, errors.New("off")), CodeDisabledByFlag},
	} {
		if got := CodeOf(c.err); got != c.want {
			t.Errorf("CodeOf(%v) = %q, want %q", c.err, got, c.want)
		}
		if c.err != nil && WithCode(CodeError, c.err).Error() != c.err.Error() {
			t.Errorf("WithCode changes the text of %v", c.err)
		}
	}
}

// TestCodesDocumented: the page that documents eztunnel_feature_enabled
// lists every code.
func TestCodesDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "families", "shortcut.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range Codes {
		if !strings.Contains(string(doc), "`"+string(c)+"`") {
			t.Errorf("docs/families/shortcut.md does not list the reason code %s", c)
		}
	}
}
