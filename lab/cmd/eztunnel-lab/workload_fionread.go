package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

// fionreadFirst is what workload fionread-first prints: FIONREAD on a fresh
// connection's first bytes, before the application read anything.
type fionreadFirst struct {
	FIONREAD int    `json:"fionread"`
	Read     string `json:"read"`
}

// workloadFionreadFirstCmd connects, waits until the server's first bytes
// are readable and all of them arrived, asks FIONREAD before any read, then
// reads them: the observable a reader that sizes its read by FIONREAD sees.
func workloadFionreadFirstCmd() *cobra.Command {
	var addr string
	var want int
	cmd := &cobra.Command{
		Use:   "fionread-first",
		Short: "FIONREAD on a new connection's first bytes, before any read; then the bytes",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := net.DialTimeout("tcp", addr, 10*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			tc := c.(*net.TCPConn)
			raw, err := tc.SyscallConn()
			if err != nil {
				return err
			}
			var out fionreadFirst
			var ierr error
			deadline := time.Now().Add(10 * time.Second)
			// Poll until the TCP receive side holds every byte (SIOCINQ on
			// plain TCP; tcp_poll says readable under eztunnel too), with
			// MSG_PEEK, which tells what is there without consuming it.
			for {
				var n int
				if err := raw.Control(func(fd uintptr) {
					buf := make([]byte, want+1)
					n, _, ierr = unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
				}); err != nil {
					return err
				}
				if n >= want || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := raw.Control(func(fd uintptr) { out.FIONREAD, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
				return err
			}
			if ierr != nil {
				return fmt.Errorf("FIONREAD: %w", ierr)
			}
			buf := make([]byte, want)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			n, err := io.ReadFull(c, buf)
			out.Read = string(buf[:n])
			if err != nil {
				return fmt.Errorf("read %d of %d bytes: %w", n, want, err)
			}
			return json.NewEncoder(os.Stdout).Encode(out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "", "server ip:port")
	f.IntVar(&want, "bytes", 0, "how many bytes the server sends first")
	return cmd
}
