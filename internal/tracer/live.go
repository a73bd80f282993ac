package tracer

import (
	"fmt"
	"io"
	"math/bits"
	"strings"
)

// Histogram counts latencies in power-of-two nanosecond buckets.
type Histogram struct {
	Buckets [40]uint64
	N       uint64
}

// Add counts one latency.
func (h *Histogram) Add(ns uint64) {
	b := bits.Len64(ns)
	if b >= len(h.Buckets) {
		b = len(h.Buckets) - 1
	}
	h.Buckets[b]++
	h.N++
}

// Render draws the histogram as bars of at most width characters.
func (h *Histogram) Render(w io.Writer, title string, width int) {
	fmt.Fprintf(w, "%s (n=%d)\n", title, h.N)
	var max uint64
	lo, hi := -1, -1
	for i, c := range h.Buckets {
		if c > 0 {
			if lo < 0 {
				lo = i
			}
			hi = i
			if c > max {
				max = c
			}
		}
	}
	if lo < 0 {
		fmt.Fprintln(w, "  (no packets)")
		return
	}
	for i := lo; i <= hi; i++ {
		from := uint64(0)
		if i > 0 {
			from = 1 << (i - 1)
		}
		bar := int(h.Buckets[i] * uint64(width) / max)
		fmt.Fprintf(w, "  %10s .. %-10s %8d |%s\n", fmtNS(from), fmtNS(1<<i), h.Buckets[i], strings.Repeat("#", bar))
	}
}

func fmtNS(ns uint64) string {
	switch {
	case ns >= 1e6:
		return fmt.Sprintf("%.1fms", float64(ns)/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.1fus", float64(ns)/1e3)
	}
	return fmt.Sprintf("%dns", ns)
}
