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

// TestOneImportName: every package of this module is imported under one
// name everywhere (its own, or one alias), tests and the lab included.
func TestOneImportName(t *testing.T) {
	const module = "github.com/eztunnel/eztunnel/"
	fset := token.NewFileSet()
	names := map[string]map[string]string{} // import path -> name -> a file using it
	err := filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "tools" || strings.HasPrefix(d.Name(), ".")) && p != "../.." {
			return filepath.SkipDir // modules of their own
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, im := range f.Imports {
			path := strings.Trim(im.Path.Value, `"`)
			if !strings.HasPrefix(path, module) {
				continue
			}
			name := filepath.Base(path) // the package's own name, as far as this test knows
			if im.Name != nil {
				name = im.Name.Name
			}
			if names[path] == nil {
				names[path] = map[string]string{}
			}
			names[path][name] = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 20 {
		t.Fatalf("%d packages of the module imported: not the repository?", len(names))
	}
	for path, byName := range names {
		if len(byName) > 1 {
			t.Errorf("%s is imported as %v", path, byName)
		}
	}
}
