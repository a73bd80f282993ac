package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// TestConnPrinter: the streamed -o json is byte for byte what the whole
// listing through cli.Render's encoder was (an empty listing too), and a
// table of at most tableBlock ends is one aligned table, the header once.
func TestConnPrinter(t *testing.T) {
	for _, n := range []int{0, 1, 3, tableBlock + 5} {
		conns := []datapath.Connection{}
		for i := range n {
			conns = append(conns, datapath.Connection{Cookie: uint64(i), PeerCookie: uint64(i + 1), Role: "client", Pod: "ns/a<b>",
				Client: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(i)), Server: netip.MustParseAddrPort("[fd00::2]:80")})
		}
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetIndent("", "  ")
		enc.Encode(conns)
		var got, table bytes.Buffer
		p, tp := newConnPrinter(&got, true), newConnPrinter(&table, false)
		for _, c := range conns {
			if err := p.add(c); err != nil {
				t.Fatal(err)
			}
			tp.add(c)
		}
		if err := p.close(); err != nil {
			t.Fatal(err)
		}
		tp.close()
		if got.String() != want.String() {
			t.Fatalf("%d ends: -o json\n%s\nwant\n%s", n, got.String(), want.String())
		}
		lines := strings.Split(strings.TrimSuffix(table.String(), "\n"), "\n")
		if len(lines) != n+1 || !strings.HasPrefix(lines[0], "COOKIE") || strings.Count(table.String(), "COOKIE") != 1 {
			t.Fatalf("%d ends: %d table lines, header %q", n, len(lines), lines[0])
		}
		if n > 0 && n <= tableBlock && len(lines[0]) > len(lines[n]) {
			t.Fatalf("%d ends: the rows are not aligned with the header:\n%s\n%s", n, lines[0], lines[n])
		}
	}
}
