// Command depcheck proves the external programs the code and the tests run
// (the registry in internal/sysexec) come from Debian packages that
// scripts/install-deps.sh installs or that are Essential, and that on this
// machine each resolves, through PATH, to a file of that package.
//
//	go run ./scripts/depcheck [-static]
//
// -static only checks the package list (no dpkg queries of this machine's
// files): the registry against install-deps.sh and Essential.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

func main() {
	static := flag.Bool("static", false, "only check the registry against install-deps.sh and Essential")
	deps := flag.String("install-deps", "scripts/install-deps.sh", "the install script whose pkgs_<group>=(...) lists are checked")
	flag.Parse()
	if err := run(*deps, *static); err != nil {
		fmt.Fprintln(os.Stderr, "depcheck: FAIL:\n"+err.Error())
		os.Exit(1)
	}
}

// pkgsLine is one group's package array, pkgs_<group>=(...), comments and
// line breaks inside allowed.
var pkgsLine = regexp.MustCompile(`(?m)^pkgs_[a-z0-9]+=\(([^)]*)\)`)

func installed(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ms := pkgsLine.FindAllSubmatch(b, -1)
	if ms == nil {
		return nil, fmt.Errorf("%s: no pkgs_<group>=(...) line", path)
	}
	out := map[string]bool{}
	for _, m := range ms {
		for _, line := range strings.Split(string(m[1]), "\n") {
			line, _, _ = strings.Cut(line, "#")
			for _, p := range strings.Fields(line) {
				out[p] = true
			}
		}
	}
	return out, nil
}

func query(args ...string) (string, error) {
	out, err := sysexec.Command(context.Background(), "dpkg-query", args...).Output()
	return strings.TrimSpace(string(out)), err
}

func essential(pkg string) bool {
	v, err := query("-W", "-f=${Essential}", pkg)
	return err == nil && v == "yes"
}

// owner returns the package owning path, following symlinks
// (alternatives) and the /usr merge.
func owner(path string) (string, error) {
	cands := []string{path}
	if r, err := filepath.EvalSymlinks(path); err == nil && r != path {
		cands = append(cands, r)
	}
	for _, c := range append([]string(nil), cands...) {
		if rest, ok := strings.CutPrefix(c, "/usr"); ok {
			cands = append(cands, rest)
		} else {
			cands = append(cands, "/usr"+c)
		}
	}
	for _, c := range cands {
		out, err := sysexec.Command(context.Background(), "dpkg", "-S", c).Output()
		if err != nil {
			continue
		}
		line, _, _ := strings.Cut(string(out), "\n")
		if pkgs, _, ok := strings.Cut(line, ": "); ok && !strings.HasPrefix(pkgs, "diversion by") {
			p, _, _ := strings.Cut(pkgs, ",")
			p, _, _ = strings.Cut(strings.TrimSpace(p), ":") // drop :arch
			return p, nil
		}
	}
	return "", fmt.Errorf("no package owns %s", path)
}

func run(deps string, static bool) error {
	listed, err := installed(deps)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range sysexec.Programs() {
		if p.Package == sysexec.Toolchain {
			if !static {
				if _, err := exec.LookPath(p.Name); err != nil {
					errs = append(errs, fmt.Errorf("%s (Go toolchain) not in PATH: install Go", p.Name))
				}
			}
			fmt.Printf("%-18s %-14s %s\n", p.Name, "(toolchain)", p.Why)
			continue
		}
		how := "install-deps"
		if !listed[p.Package] {
			if !essential(p.Package) {
				errs = append(errs, fmt.Errorf("%s needs Debian package %s, which %s does not install and which is not Essential", p.Name, p.Package, deps))
				continue
			}
			how = "essential"
		}
		fmt.Printf("%-18s %-14s %-12s %s\n", p.Name, p.Package, how, p.Why)
		if static {
			continue
		}
		if st, err := query("-W", "-f=${Status}", p.Package); err != nil || !strings.HasSuffix(st, "installed") || strings.Contains(st, "not-installed") {
			errs = append(errs, fmt.Errorf("%s: package %s is not installed: run scripts/install-deps.sh", p.Name, p.Package))
			continue
		}
		path, err := sysexec.Path(p.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s although package %s is installed", err, p.Package))
			continue
		}
		got, err := owner(path)
		if err != nil || got != p.Package {
			errs = append(errs, fmt.Errorf("%s resolves to %s, owned by %q (%v), not by package %s", p.Name, path, got, err, p.Package))
		}
	}
	if _, ok := sysexec.Lookup(sysexec.Forbidden); ok {
		errs = append(errs, errors.New("nft is registered: nothing may run it"))
	}
	return errors.Join(errs...)
}
