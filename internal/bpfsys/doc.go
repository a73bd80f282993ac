// Package bpfsys is the BPF plumbing shared by every program family and the
// tracer: the BPF filesystem and pin directories (schema checks, per-family
// link directories), install transactions (link update with restore),
// netfilter links at a free priority, network-namespace switching and kernel
// feature probes.
package bpfsys
