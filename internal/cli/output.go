package cli

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// OutputFlag adds -o/--output (table or json) to cmd.
func OutputFlag(cmd *cobra.Command, output *string) {
	cmd.Flags().StringVarP(output, "output", "o", "table", "output format: table or json")
}

// CheckOutput rejects an unknown -o value before any work is done.
func CheckOutput(output string) error {
	if output != "table" && output != "json" {
		return fmt.Errorf("-o %q: want table or json", output)
	}
	return nil
}

// Render prints v as indented JSON, or calls table, as -o asks.
func Render(output string, v any, table func()) error {
	if output != "json" {
		table()
		return nil
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
