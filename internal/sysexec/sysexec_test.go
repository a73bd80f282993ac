package sysexec

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// programArg maps functions that take a program name to the index of that
// argument: the tree's exec wrappers.
var programArg = map[string]int{
	"Command":  1, // sysexec.Command(ctx, name, ...) (checked for sysexec only)
	"NetnsCmd": 2, // netlab.NetnsCmd(ctx, netns, name, ...)
	"Cmd":      1, // (*netlab.Pod).Cmd(ctx, name, ...)
	"nsExec":   2, // e2e: nsExec(t, netns, name, ...)
	"nsTry":    1, // e2e: nsTry(netns, name, ...)
}

// TestNoExecBypass parses every Go file of the repository: nothing but this
// package calls os/exec's Command or CommandContext, every literal program
// name given to an exec wrapper is registered, and nothing names nft.
func TestNoExecBypass(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	self, _ := filepath.Abs(".")
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n != "." && (strings.HasPrefix(n, ".") || n == "testdata" || n == "results" || n == "bin") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || path == filepath.Join(self, "sysexec_test.go") {
			return nil
		}
		files++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		execName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"os/exec"` {
				execName = "exec"
				if imp.Name != nil {
					execName = imp.Name.Name
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var fn string
			switch x := call.Fun.(type) {
			case *ast.SelectorExpr:
				fn = x.Sel.Name
				if id, ok := x.X.(*ast.Ident); ok && execName != "" && id.Name == execName &&
					(fn == "Command" || fn == "CommandContext") && filepath.Dir(path) != self {
					t.Errorf("%s: exec.%s bypasses internal/sysexec", fset.Position(call.Pos()).String()[len(root)+1:], fn)
				}
				// Only sysexec.Command's first argument is a program name.
				if id, ok := x.X.(*ast.Ident); fn == "Command" && (!ok || id.Name != "sysexec") {
					fn = ""
				}
			case *ast.Ident:
				fn = x.Name
			}
			for _, a := range call.Args {
				if lit, ok := a.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if v, _ := strconv.Unquote(lit.Value); v == "nft" {
						t.Errorf("%s: %s: nothing may run nft", rel, fset.Position(lit.Pos()))
					}
				}
			}
			if i, ok := programArg[fn]; ok && i < len(call.Args) {
				if lit, ok := call.Args[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					if err := Check(v); err != nil {
						t.Errorf("%s: %v", fset.Position(lit.Pos()), err)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("parsed only %d Go files under %s", files, root)
	}
}

func TestCommandRefusesUnknown(t *testing.T) {
	if err := Command(t.Context(), "no-such-program").Run(); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Errorf("unknown program: %v", err)
	}
	if err := Command(t.Context(), "nft", "list", "ruleset").Run(); err == nil || !strings.Contains(err.Error(), "nftables") {
		t.Errorf("nft: %v", err)
	}
	for _, p := range Programs() {
		if p.Why == "" {
			t.Errorf("%s: no reason", p.Name)
		}
	}
}
