package workload

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// Hold opens n stream connections to addr, sends each one byte (so every
// connection is established and past its first message), and keeps them
// idle until ctx ends. ready is called once all are open.
func Hold(ctx context.Context, addr string, n, parallel int, ready func()) error {
	h := streamHeader{Up: 1 << 40, Down: 0, Chunk: 1, Flags: flagNoCheck}
	msg := append(h.marshal(), 0)
	conns := make([]net.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			c, err := net.Dial("tcp", addr)
			if err == nil {
				_, err = c.Write(msg)
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("connection %d: %w", i, err)
				}
				mu.Unlock()
				if c != nil {
					c.Close()
				}
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	ready()
	<-ctx.Done()
	return nil
}
