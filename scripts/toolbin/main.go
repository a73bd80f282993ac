// Command toolbin prints the path of a tools module's binary (tools/<name>),
// building it into the cache first when needed (see internal/toolbin).
//
//	go run ./scripts/toolbin helm|ezimage|sbom
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/eztunnel/eztunnel/internal/toolbin"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: toolbin NAME (helm, ezimage, sbom)")
		os.Exit(2)
	}
	repo, err := toolbin.RepoRoot()
	if err == nil {
		var path string
		if path, err = toolbin.Build(context.Background(), repo, os.Args[1]); err == nil {
			fmt.Println(path)
			return
		}
	}
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
