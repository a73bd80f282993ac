package bypass

import "testing"

// TestPairedBlocks: the default cuts --pairs into blocks of 20 quads (one
// block below 40); an explicit --blocks must divide --pairs into blocks of
// at least 4 quads.
func TestPairedBlocks(t *testing.T) {
	for _, c := range []struct{ pairs, blocks, want int }{
		{200, 0, 10}, {20, 0, 1}, {39, 0, 1}, {40, 0, 2}, {100, 0, 5}, {200, 4, 4}, {200, 50, 50}, {20, 5, 5},
	} {
		got, err := pairedBlocks(Options{Pairs: c.pairs, Blocks: c.blocks})
		if err != nil || got != c.want {
			t.Errorf("--pairs %d --blocks %d: %d, %v; want %d", c.pairs, c.blocks, got, err, c.want)
		}
	}
	for _, c := range []struct{ pairs, blocks int }{{200, 7}, {200, 100}, {20, -1}, {20, 6}} {
		if got, err := pairedBlocks(Options{Pairs: c.pairs, Blocks: c.blocks}); err == nil {
			t.Errorf("--pairs %d --blocks %d accepted: %d", c.pairs, c.blocks, got)
		}
	}
}
