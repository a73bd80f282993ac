package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/lab/workload"
)

// workloadScaleCmds: the server and the holder of `bench scale`, sized to
// a process's descriptor limit.
func workloadScaleCmds() []*cobra.Command {
	var addr, ready string
	serve := &cobra.Command{
		Use:   "scale-serve",
		Short: "Echo every byte of every connection, one epoll thread, until killed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fd, err := workload.RawListen(addr)
			if err != nil {
				return err
			}
			// The holders connect all at once: a deep accept queue
			// (net.core.somaxconn caps it) keeps SYNs from being dropped.
			if err := unix.Listen(fd, 65535); err != nil {
				return err
			}
			if ready != "" {
				if err := os.WriteFile(ready, []byte("ready\n"), 0o644); err != nil {
					return err
				}
			}
			return workload.ServeManyEcho(fd)
		},
	}
	serve.Flags().StringVar(&addr, "addr", ":7100", "listen address")
	serve.Flags().StringVar(&ready, "ready-file", "", "file written once listening")
	return []*cobra.Command{serve, workloadScaleHoldCmd()}
}

func workloadScaleHoldCmd() *cobra.Command {
	var addr, dir string
	var conns, parallel, size, every int
	var base uint64
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "scale-hold",
		Short: "Open connections to a scale-serve server, check a hello on each, then check message rounds on signals until killed",
		Long: `Open --conns connections to a scale-serve server and check a hello on each; then write
DIR/ready.json ({"conns","seconds"}). SIGUSR2 sends this round's message on every --every-th
connection without reading the echoes (and writes DIR/sent-R); SIGUSR1 reads back the echoes
of what SIGUSR2 sent (or, if it sent nothing this round, sends the message on every connection
and reads it back, --parallel connections at once), compares them, and writes DIR/round-R.json. The first failure to open a connection exits 1 with the reason.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if conns < 1 || dir == "" {
				return fmt.Errorf("give --conns (at least 1) and --dir")
			}
			sigs := make(chan os.Signal, 16)
			signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
			ctx := cmd.Context()
			start := time.Now()
			h, err := workload.OpenScale(ctx, addr, conns, base, size, parallel)
			if err != nil {
				return err
			}
			defer h.Close()
			if err := writeJSONFile(filepath.Join(dir, "ready.json"), map[string]any{"conns": conns, "seconds": time.Since(start).Seconds()}); err != nil {
				return err
			}
			for round := 0; ; {
				if <-sigs == syscall.SIGUSR2 {
					h.Send(ctx, every)
					if err := os.WriteFile(filepath.Join(dir, "sent-"+strconv.Itoa(round)), nil, 0o644); err != nil {
						return err
					}
					continue
				}
				r := h.Check(ctx, timeout)
				if err := writeJSONFile(filepath.Join(dir, fmt.Sprintf("round-%d.json", round)), r); err != nil {
					return err
				}
				round++
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "", "scale-serve server host:port")
	f.IntVar(&conns, "conns", 1000, "connections to hold")
	f.Uint64Var(&base, "base", 0, "id of the first connection (ids make every message unique)")
	f.IntVar(&parallel, "parallel", 32, "connections opened (and rounds checked) at once")
	f.IntVar(&size, "size", 24, "bytes of each message (at least 16)")
	f.IntVar(&every, "every", 1, "SIGUSR2 sends on every n-th connection")
	f.DurationVar(&timeout, "timeout", time.Minute, "how long a round waits for each echo")
	f.StringVar(&dir, "dir", "", "directory of the ready, sent and round files")
	return cmd
}

// writeJSONFile writes v to path through a temporary file, so a reader
// polling for path never sees it half written.
func writeJSONFile(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", b, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
