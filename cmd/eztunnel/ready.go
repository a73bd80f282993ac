package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// readyCmd is the DaemonSet's readiness probe. An HTTP probe cannot tell
// the agents of one node apart: they run with hostNetwork, so during a
// surge update the new pod's probe of the health port reaches the old
// agent, which answers ready before the new one has taken over, and the
// old pod is deleted too early. This probe first checks that the node's
// lock names this pod, then asks the health port (freed by the old agent
// before it lets the lock go, so it is ours).
//
// With --healthz it is the liveness probe: it asks /healthz and skips the
// lock (a standing-by agent lives too). Being exec'd in the pod, both reach
// a health port bound to loopback, which an httpGet probe (sent by the
// kubelet to the pod's IP, the node's) would not.
func readyCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var lockFile, addr string
	var healthz bool
	timeout := 2 * time.Second
	cmd := &cobra.Command{
		Use:   "ready",
		Short: "Exit 0 when this process's pod holds the node's agent lock and its agent answers /readyz (the DaemonSet's readiness probe)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if addr == "" {
				return fmt.Errorf("--health-addr is required (the agent's --health-addr)")
			}
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return fmt.Errorf("--health-addr %q: %w", addr, err)
			}
			if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
				host = "127.0.0.1"
				if ip != nil && ip.To4() == nil {
					host = "::1"
				}
			}
			path, not := "/readyz", "not ready"
			if healthz {
				path, not = "/healthz", "not live"
			} else {
				if lockFile == "" {
					lockFile = cfg.Layout().Lock()
				}
				me := agentlock.Owner()
				holder, err := agentlock.Holder(lockFile)
				if err != nil {
					return fmt.Errorf("not ready: %w", err)
				}
				if holder != me {
					return fmt.Errorf("not ready: the datapath is managed by %s, not by %s (lock %s)", holder, me, lockFile)
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			url := "http://" + net.JoinHostPort(host, port) + path
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("%s: %w", not, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s: %s %s", not, url, resp.Status, strings.TrimSpace(string(body)))
			}
			fmt.Fprintln(cmd.OutOrStdout(), strings.TrimSpace(string(body)))
			return nil
		},
	}
	layoutFlags(cmd.Flags(), &cfg, &lockFile)
	cmd.Flags().StringVar(&addr, "health-addr", "", "the agent's --health-addr (an unspecified host means loopback)")
	cmd.Flags().DurationVar(&timeout, "timeout", timeout, "how long to wait for /readyz")
	cmd.Flags().BoolVar(&healthz, "healthz", false, "ask /healthz instead, without the lock check (the DaemonSet's liveness probe)")
	return cmd
}
