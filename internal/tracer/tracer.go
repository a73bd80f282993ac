package tracer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// Attachment is one attached program, for listings and overhead.
type Attachment struct {
	Kind, Where string
	Program     *ebpf.Program
}

// Tracer is a loaded and attached tracer. Close detaches everything.
type Tracer struct {
	cfg      Config
	objs     *tracerObjects
	links    []link.Link
	rd       *ringbuf.Reader
	Attached []Attachment
	evicted  atomic.Uint64 // removed by the age sweep (Go side)
	open     atomic.Uint64 // still live when the trace stopped
}

// Open loads the programs with cfg's filters and attaches them. On error
// nothing stays loaded or attached.
func Open(cfg Config) (_ *Tracer, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Tracer{cfg: cfg}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	if t.objs, err = load(cfg); err != nil {
		return nil, err
	}
	if t.rd, err = ringbuf.NewReader(t.objs.TrcEvents); err != nil {
		return nil, fmt.Errorf("ring buffer reader: %w", err)
	}
	if err = t.attachTracepoints(cfg.RawTP); err != nil {
		return nil, err
	}
	if err = t.attachTCX(cfg.Interfaces); err != nil {
		return nil, err
	}
	if err = t.attachNetfilter(cfg.NetNS); err != nil {
		return nil, err
	}
	return t, nil
}

// detach closes every link; events already produced stay readable.
func (t *Tracer) detach() error {
	var errs []error
	for i := len(t.links) - 1; i >= 0; i-- {
		errs = append(errs, t.links[i].Close())
	}
	t.links = nil
	return errors.Join(errs...)
}

// Close detaches and unloads everything. Safe to call more than once.
func (t *Tracer) Close() error {
	errs := []error{t.detach()}
	if t.rd != nil {
		errs = append(errs, t.rd.Close())
		t.rd = nil
	}
	if t.objs != nil {
		errs = append(errs, t.objs.Close())
		t.objs = nil
	}
	return errors.Join(errs...)
}

// Run delivers every record to fn until ctx is done, then detaches, reads
// what is left in the ring buffer and emits the lifetimes still open.
// Lifetimes idle longer than MaxAge are removed and emitted as evicted.
func (t *Tracer) Run(ctx context.Context, fn func(Record)) error {
	sweepEvery := t.cfg.MaxAge / 2
	nextSweep := time.Now().Add(sweepEvery)
	var pkt tracerEzTrcPkt
	for {
		stopping := ctx.Err() != nil
		if stopping {
			if err := t.detach(); err != nil {
				return err
			}
			t.rd.SetDeadline(time.Now())
		} else {
			t.rd.SetDeadline(time.Now().Add(10 * time.Millisecond)) // records come without wakeups (trc_emit)
		}
		for {
			rec, err := t.rd.Read()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if err != nil {
				return fmt.Errorf("read ring buffer: %w", err)
			}
			if err := binary.Read(bytes.NewReader(rec.RawSample), binary.LittleEndian, &pkt); err != nil {
				return fmt.Errorf("decode record: %w", err)
			}
			fn(fromPkt(&pkt))
			if !stopping && time.Now().After(nextSweep) {
				break
			}
		}
		if stopping {
			n, err := t.sweep(0, EndOpen, fn)
			t.open.Add(n)
			return err
		}
		if time.Now().After(nextSweep) {
			n, err := t.sweep(t.cfg.MaxAge, EndEvicted, fn)
			if err != nil {
				return err
			}
			t.evicted.Add(n)
			nextSweep = time.Now().Add(sweepEvery)
		}
	}
}

// sweep removes lifetimes idle for at least age and emits them with end.
// A lifetime the kernel updates between the read and the delete is emitted
// as read (documented race).
func (t *Tracer) sweep(age time.Duration, end End, fn func(Record)) (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	limit := uint64(ts.Nano()) - uint64(age.Nanoseconds())
	var key uint64
	var pkt tracerEzTrcPkt
	var old []uint64
	it := t.objs.TrcPkts.Iterate()
	for it.Next(&key, &pkt) {
		if pkt.LastNs <= limit {
			old = append(old, key)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterate packet table: %w", err)
	}
	var n uint64
	for _, k := range old {
		err := t.objs.TrcPkts.LookupAndDelete(&k, &pkt)
		if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) {
			// Kernels without lookup-and-delete on hash maps.
			if err = t.objs.TrcPkts.Lookup(&k, &pkt); err == nil {
				err = t.objs.TrcPkts.Delete(&k)
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue // freed meanwhile
		}
		if err != nil {
			return n, fmt.Errorf("remove idle packet record: %w", err)
		}
		pkt.End = uint8(end)
		fn(fromPkt(&pkt))
		n++
	}
	return n, nil
}
