package bench

import (
	"fmt"
	"math"
	"strings"
)

// WriteTable writes a Markdown table, every column padded; numbers right-aligned.
func WriteTable(b *strings.Builder, header []string, rows [][]string) {
	width := make([]int, len(header))
	for _, row := range append([][]string{header}, rows...) {
		for i, c := range row {
			width[i] = max(width[i], len(c))
		}
	}
	line := func(cells []string) {
		for i, c := range cells {
			if i == 0 {
				fmt.Fprintf(b, "| %-*s ", width[i], c)
			} else {
				fmt.Fprintf(b, "| %*s ", width[i], c)
			}
		}
		b.WriteString("|\n")
	}
	line(header)
	for i, wd := range width {
		dash := strings.Repeat("-", wd+2)
		if i > 0 {
			dash = dash[:wd+1] + ":"
		}
		b.WriteString("|" + dash)
	}
	b.WriteString("|\n")
	for _, row := range rows {
		line(row)
	}
}

// Num formats x with digits decimals; NaN is "-".
func Num(x float64, digits int) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.*f", digits, x)
}

// WithUnit formats a change ("%") or a ratio ("x"); NaN and Inf are "-".
func WithUnit(x float64, unit string) string {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return "-"
	case unit == "%":
		return fmt.Sprintf("%+.1f%%", x)
	default:
		return fmt.Sprintf("%.2fx", x)
	}
}

// Ratio is x/base; NaN when base is 0.
func Ratio(x, base float64) float64 {
	if base == 0 {
		return math.NaN()
	}
	return x / base
}
