package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines bounds a function of the product code (cmd/, internal/,
// tests and generated code aside): one that grows past it is split into
// parts that can be read, and tested, alone.
const maxFuncLines = 120

// TestFunctionLength: no function of the product code exceeds maxFuncLines.
func TestFunctionLength(t *testing.T) {
	fset := token.NewFileSet()
	files := 0
	for _, root := range []string{"../../cmd", "../../internal"} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") ||
				strings.Contains(p, "_bpfel") || strings.HasPrefix(d.Name(), "zz_generated") {
				return err
			}
			f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			files++
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
				if n := end.Line - start.Line + 1; n > maxFuncLines {
					t.Errorf("%s:%d: %s is %d lines, over %d", p, start.Line, fn.Name.Name, n, maxFuncLines)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files < 100 {
		t.Fatalf("walked %d files: not the repository's cmd/ and internal/?", files)
	}
}
