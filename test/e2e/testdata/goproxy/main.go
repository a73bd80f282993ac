// goproxy: the Go TCP proxy written the usual way (accept, dial, io.Copy in
// both directions, CloseWrite when a side ends), with its echo server and
// client, for test/e2e/splice_test.go. (*net.TCPConn).ReadFrom splices when
// its source is a TCP connection (internal/poll.Splice).
//
//	goproxy server LISTEN                    echo every connection to its EOF (read/write, no splice)
//	goproxy proxy LISTEN TARGET [PEEK]       PEEK > 0: Read PEEK bytes first (read-then-splice)
//	goproxy client ADDR EXCHANGES SIZE SECS  one connection per exchange; prints a JSON result
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand"
	"net"
	"os"
	"strconv"
	"time"
)

func main() {
	switch os.Args[1] {
	case "server":
		serve(os.Args[2], func(c *net.TCPConn) {
			// A reader that is not a *net.TCPConn: plain reads (recvmsg), no splice.
			io.Copy(c, struct{ io.Reader }{c})
			c.CloseWrite()
		})
	case "proxy":
		peek := 0
		if len(os.Args) > 4 {
			peek, _ = strconv.Atoi(os.Args[4])
		}
		serve(os.Args[2], func(c *net.TCPConn) { proxy(c, os.Args[3], peek) })
	case "client":
		n, _ := strconv.Atoi(os.Args[3])
		size, _ := strconv.Atoi(os.Args[4])
		secs, _ := strconv.Atoi(os.Args[5])
		client(os.Args[2], n, size, time.Duration(secs)*time.Second)
	default:
		log.Fatalf("unknown mode %q", os.Args[1])
	}
}

func serve(addr string, handle func(*net.TCPConn)) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			defer c.Close()
			handle(c.(*net.TCPConn))
		}()
	}
}

func proxy(in *net.TCPConn, target string, peek int) {
	out, err := net.Dial("tcp", target)
	if err != nil {
		log.Print(err)
		return
	}
	defer out.Close()
	var first []byte
	if peek > 0 {
		first = make([]byte, peek)
		n, err := io.ReadFull(in, first)
		if err != nil {
			log.Printf("read first %d bytes: %d, %v", peek, n, err)
			return
		}
		if _, err := out.Write(first); err != nil {
			log.Print(err)
			return
		}
	}
	done := make(chan int64)
	go func() {
		n, _ := io.Copy(out, in)
		out.(*net.TCPConn).CloseWrite()
		done <- n
	}()
	n, _ := io.Copy(in, out)
	in.CloseWrite()
	m := <-done
	if m+int64(len(first)) == 0 || n == 0 {
		log.Printf("proxied %d+%d bytes", m+int64(len(first)), n)
	}
}

type result struct {
	Exchanges int    `json:"exchanges"`
	OK        int    `json:"ok"`
	Bad       int    `json:"bad"`
	FirstErr  string `json:"first_error,omitempty"`
}

// client runs up to n exchanges (fewer if the time is up): connect, write
// size bytes, CloseWrite, read the echo to EOF, compare byte by byte.
func client(addr string, n, size int, limit time.Duration) {
	var r result
	end := time.Now().Add(limit)
	rng := rand.New(rand.NewSource(1))
	buf := make([]byte, size)
	for i := 0; i < n && time.Now().Before(end); i++ {
		r.Exchanges++
		rng.Read(buf)
		if err := exchange(addr, buf, end); err != nil {
			r.Bad++
			if r.FirstErr == "" {
				r.FirstErr = fmt.Sprintf("exchange %d: %v", i, err)
			}
			continue
		}
		r.OK++
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

func exchange(addr string, buf []byte, end time.Time) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(end.Add(5 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(buf)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		errc <- err
	}()
	got, rerr := io.ReadAll(c)
	if err := <-errc; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if rerr != nil {
		return fmt.Errorf("read after %d bytes: %w", len(got), rerr)
	}
	if !bytes.Equal(got, buf) {
		i := 0
		for i < len(got) && i < len(buf) && got[i] == buf[i] {
			i++
		}
		return fmt.Errorf("echo differs: %d bytes back of %d, first difference at %d", len(got), len(buf), i)
	}
	return nil
}
