package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

// workloadTenantCmds are the two ends the tenant-isolation tests watch: a
// sink that reports every byte each accepted connection receives, and a
// sender that connects from a fixed address and reports every byte it
// receives. Each event is one JSON line on stdout, written as it happens.
func workloadTenantCmds() []*cobra.Command {
	return []*cobra.Command{workloadSinkCmd(), workloadSendCmd()}
}

// tenantEvent is one line of sink's or send's output.
type tenantEvent struct {
	Conn      int    `json:"conn,omitempty"`
	Peer      string `json:"peer,omitempty"`
	Connected bool   `json:"connected,omitempty"`
	Data      string `json:"data,omitempty"`
	Sent      int    `json:"sent,omitempty"`
	EOF       bool   `json:"eof,omitempty"`
	Err       string `json:"err,omitempty"`
}

var tenantOut sync.Mutex

func emit(ev tenantEvent) {
	tenantOut.Lock()
	defer tenantOut.Unlock()
	json.NewEncoder(os.Stdout).Encode(ev)
}

func workloadSinkCmd() *cobra.Command {
	var addr, reply, ready string
	cmd := &cobra.Command{
		Use:   "sink",
		Short: "Accept connections until killed; send each the reply, report what each receives",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			if ready != "" {
				if err := os.WriteFile(ready, []byte("ready\n"), 0o644); err != nil {
					return err
				}
			}
			for n := 1; ; n++ {
				c, err := ln.Accept()
				if err != nil {
					return err
				}
				go func() {
					defer c.Close()
					emit(tenantEvent{Conn: n, Peer: c.RemoteAddr().String(), Connected: true})
					if reply != "" {
						if _, err := c.Write([]byte(reply)); err != nil {
							emit(tenantEvent{Conn: n, Err: err.Error()})
						}
					}
					readAll(c, n)
				}()
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "", "listen ip:port")
	f.StringVar(&reply, "reply", "", "bytes to send on every accepted connection")
	f.StringVar(&ready, "ready-file", "", "file written once listening")
	return cmd
}

// readAll reports each read of c until EOF or an error.
func readAll(c net.Conn, n int) {
	buf := make([]byte, 64<<10)
	for {
		k, err := c.Read(buf)
		if k > 0 {
			emit(tenantEvent{Conn: n, Data: string(buf[:k])})
		}
		if err != nil {
			emit(tenantEvent{Conn: n, EOF: true, Err: err.Error()})
			return
		}
	}
}

func workloadSendCmd() *cobra.Command {
	var bind, addr, data string
	var delay, readFor time.Duration
	cmd := &cobra.Command{
		Use:   "send",
		Short: "Connect from --bind to --addr, send --data after --delay, report what arrives for --read-for",
		RunE: func(cmd *cobra.Command, _ []string) error {
			d := net.Dialer{Timeout: 20 * time.Second}
			if bind != "" {
				la, err := net.ResolveTCPAddr("tcp", bind)
				if err != nil {
					return err
				}
				d.LocalAddr = la
			}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return fmt.Errorf("connect %s from %s: %w", addr, bind, err)
			}
			emit(tenantEvent{Connected: true, Peer: c.RemoteAddr().String()})
			done := make(chan struct{})
			go func() { readAll(c, 0); close(done) }()
			time.Sleep(delay)
			if data != "" {
				k, err := c.Write([]byte(data))
				emit(tenantEvent{Sent: k})
				if err != nil {
					return err
				}
			}
			select {
			case <-done:
			case <-time.After(readFor):
			}
			return c.Close()
		},
	}
	f := cmd.Flags()
	f.StringVar(&bind, "bind", "", "local ip:port")
	f.StringVar(&addr, "addr", "", "server ip:port")
	f.StringVar(&data, "data", "", "bytes to send")
	f.DurationVar(&delay, "delay", 0, "wait this long after connecting before sending")
	f.DurationVar(&readFor, "read-for", 2*time.Second, "report received bytes this long after sending")
	return cmd
}
