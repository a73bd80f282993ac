package rtnl

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// openNetlinkProtocols returns the protocol of every netlink socket this
// process holds, from /proc/net/netlink (column Eth) matched by inode.
func openNetlinkProtocols(t *testing.T) []int {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil {
			if ino, ok := strings.CutPrefix(l, "socket:["); ok {
				inodes[strings.TrimSuffix(ino, "]")] = true
			}
		}
	}
	f, err := os.Open("/proc/net/netlink")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var protos []int
	sc := bufio.NewScanner(f)
	sc.Scan() // header: sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || !inodes[fields[9]] {
			continue
		}
		p, err := strconv.Atoi(fields[1])
		if err != nil {
			t.Fatal(err)
		}
		protos = append(protos, p)
	}
	return protos
}

func TestRouteOpensOnlyRoute(t *testing.T) {
	before := len(openNetlinkProtocols(t))
	h, err := Route()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	protos := openNetlinkProtocols(t)
	if len(protos) != before+1 {
		t.Fatalf("Route opened %d netlink sockets, want 1 (protocols now %v)", len(protos)-before, protos)
	}
	for _, p := range protos {
		if p != unix.NETLINK_ROUTE {
			t.Fatalf("a netlink socket of protocol %d is open, want only NETLINK_ROUTE (%d): %v", p, unix.NETLINK_ROUTE, protos)
		}
	}
	if _, err := h.LinkList(); err != nil {
		t.Fatalf("LinkList on the route handle: %v", err)
	}
}

// TestNoHandleWithAllFamilies fails when product code (cmd/, internal/)
// opens a netlink handle without naming its families, which opens XFRM and
// NETFILTER sockets too and fails on kernels without those modules.
func TestNoHandleWithAllFamilies(t *testing.T) {
	fset := token.NewFileSet()
	var bad []string
	for _, dir := range []string{"../../cmd", "../../internal"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				pkg, ok := sel.X.(*ast.Ident)
				if !ok || pkg.Name != "netlink" {
					return true
				}
				// NewHandle(families...), NewHandleAt(ns, families...), NewHandleAtFrom(new, cur).
				min := map[string]int{"NewHandle": 1, "NewHandleAt": 2, "NewHandleAtFrom": 99}[sel.Sel.Name]
				if min > 0 && len(call.Args) < min {
					bad = append(bad, fset.Position(call.Pos()).String()+": netlink."+sel.Sel.Name)
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(bad) > 0 {
		t.Fatalf("netlink handles opened with every family (use internal/rtnl):\n%s", strings.Join(bad, "\n"))
	}
}
