package workload

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// EarlyResult is what `workload early` prints.
type EarlyResult struct {
	Conns int `json:"conns"`
}

// EarlyWrites opens n connections to an echo server one after the other;
// on each it writes size bytes right after connect() returned (the common
// client: no wait for anything from the server), reads the echo and closes.
func EarlyWrites(addr string, n, size int) (EarlyResult, error) {
	// The echo protocol: a 4-byte little-endian size, then messages of
	// that size echoed back. Header and first message go in one write.
	msg := make([]byte, 4+size)
	binary.LittleEndian.PutUint32(msg, uint32(size))
	buf := make([]byte, size)
	for i := 0; i < n; i++ {
		fd, err := RawDial(addr)
		if err != nil {
			return EarlyResult{Conns: i}, err
		}
		err = writeFull(fd, msg)
		if err == nil {
			err = readFull(fd, buf)
		}
		unix.Close(fd)
		if err != nil {
			return EarlyResult{Conns: i}, fmt.Errorf("connection %d: %w", i+1, err)
		}
	}
	return EarlyResult{Conns: n}, nil
}
