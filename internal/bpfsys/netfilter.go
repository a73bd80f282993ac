package bpfsys

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// AttachNetfilter attaches a netfilter link at opts.Priority or, when that
// is taken, at the next free one stepping by step (+1 or -1), at most tries
// priorities in all. It returns the link and the priority it got. Quirk: the
// kernel refuses (EBUSY) two BPF programs at one hook and priority.
func AttachNetfilter(opts link.NetfilterOptions, step int32, tries int) (link.Link, int32, error) {
	if step != 1 && step != -1 {
		return nil, 0, fmt.Errorf("netfilter priority step %d must be 1 or -1", step)
	}
	var err error
	for i := 0; i < tries; i, opts.Priority = i+1, opts.Priority+step {
		var l link.Link
		if l, err = link.AttachNetfilter(opts); err == nil {
			return l, opts.Priority, nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return nil, 0, err
		}
	}
	return nil, 0, fmt.Errorf("no free priority in %d tries: %w", tries, err)
}
