package tracer

import "fmt"

// Counters of a trace: the kernel's per-CPU counters summed, and the Go
// side's evictions.
type Counters struct {
	Started   uint64 `json:"started"`    // lifetimes started (after the filter)
	Emitted   uint64 `json:"emitted"`    // records written by the kernel
	RingDrops uint64 `json:"ring_drops"` // records lost: ring buffer full
	TableFull uint64 `json:"table_full"` // lifetimes not started: table full
	Reused    uint64 `json:"reused"`     // ended by address reuse
	Aged      uint64 `json:"aged"`       // ended by age, found by the kernel
	Evicted   uint64 `json:"evicted"`    // ended by age, removed by the sweep
	Open      uint64 `json:"open"`       // still live when the trace stopped
	SockSend  uint64 `json:"sock_send"`  // sendmsg calls of matching sockets
	SockSendB uint64 `json:"sock_send_bytes"`
	SockRecv  uint64 `json:"sock_recv"`
	SockRecvB uint64 `json:"sock_recv_bytes"`
}

// Lost is how many lifetimes produced no record.
func (c Counters) Lost() uint64 { return c.RingDrops + c.TableFull }

// Counters reads the counters.
func (t *Tracer) Counters() (Counters, error) {
	c := Counters{Evicted: t.evicted.Load(), Open: t.open.Load()}
	dst := map[tracerEzTrcCounter]*uint64{
		tracerEzTrcCounterEZ_TRC_C_STARTED: &c.Started, tracerEzTrcCounterEZ_TRC_C_EMITTED: &c.Emitted,
		tracerEzTrcCounterEZ_TRC_C_RB_DROPS: &c.RingDrops, tracerEzTrcCounterEZ_TRC_C_TABLE_FULL: &c.TableFull,
		tracerEzTrcCounterEZ_TRC_C_REUSED: &c.Reused, tracerEzTrcCounterEZ_TRC_C_AGED: &c.Aged,
		tracerEzTrcCounterEZ_TRC_C_SOCK_SEND: &c.SockSend, tracerEzTrcCounterEZ_TRC_C_SOCK_SEND_BYTES: &c.SockSendB,
		tracerEzTrcCounterEZ_TRC_C_SOCK_RECV: &c.SockRecv, tracerEzTrcCounterEZ_TRC_C_SOCK_RECV_BYTES: &c.SockRecvB,
	}
	for k, p := range dst {
		var per []uint64
		if err := t.objs.TrcCounters.Lookup(uint32(k), &per); err != nil {
			return c, fmt.Errorf("counter %d: %w", k, err)
		}
		for _, v := range per {
			*p += v
		}
	}
	return c, nil
}
