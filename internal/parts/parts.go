// Package parts names the parts of eztunnel's datapath, records whether each
// runs on this node and, when one does not, the exact reason: a program the
// kernel refused (named), a helper or kfunc it lacks, a module not loaded, or
// a flag. The agent fills a Report as it loads (each optional program loads
// on its own, so one refusal takes down only its part), logs it, serves it as
// the metric eztunnel_feature_enabled{feature,reason} and writes it where
// `eztunnel status` reads it; `eztunnel preflight` makes one by trial loads.
package parts

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
)

// Name names a part.
type Name string

// The parts, in the order they are reported.
const (
	Shortcut       Name = "shortcut"            // sockops + sk_msg + SOCKHASH: node-local TCP skips the stack
	ReadAccounting Name = "read-accounting"     // bytes redirected and not read, per receiver: the unread bound
	SpliceGuard    Name = "splice-guard"        // a socket that splices (or sendfiles) takes its connection to the kernel path
	Release        Name = "release"             // hand sockets back to the kernel path (uninstall, switches)
	ShortcutNAT    Name = "shortcut-nat"        // pairing under DNAT/REDIRECT (netfilter link at POST_ROUTING)
	CloseReset     Name = "close-reset"         // RST on close for accelerated connections
	Connections    Name = "connections"         // `eztunnel connections`
	Adoption       Name = "adoption"            // connections established before the agent
	KernelBP       Name = "kernel-backpressure" // the kernel makes a redirecting sender wait: bulk transfers keep the shortcut
	Bypass         Name = "bypass"              // bridge bypass (tcx redirect_peer / redirect_neigh)
	ServicesLB     Name = "services"            // ClusterIP at the socket
	NodePort       Name = "nodeport"            // NodePort at tcx ingress
	SocketDestroy  Name = "socket-destroy"      // Service LB: destroy sockets of removed backends
	Tracer         Name = "tracer"              // `eztunnel trace`
)

// All lists every part in report order.
var All = []Name{Shortcut, ReadAccounting, SpliceGuard, KernelBP, Release, ShortcutNAT, CloseReset, Connections, Adoption,
	Bypass, ServicesLB, NodePort, SocketDestroy, Tracer}

// Status is one part on this node.
type Status struct {
	Part Name `json:"part"`
	// Runs: the part's programs loaded (the agent) or would load (preflight).
	Runs bool `json:"runs"`
	// Reason why it does not run: what refused or is missing, naming the
	// program; "off (--flag)" when the user turned it off.
	Reason string `json:"reason,omitempty"`
	// Code is the reason's kind, one of Codes: the metrics' label.
	Code Code `json:"code,omitempty"`
	// Via names the mechanism, where a part has more than one.
	Via string `json:"via,omitempty"`
	// Standby: a running part attached nowhere now because it could not
	// act here, and why (the bypass where conntrack does not run).
	Standby string `json:"standby,omitempty"`
	// Idle: devices a running part does not attach to because it could
	// not act there, each with why (the bypass: a pod veth with no pod
	// address learnt yet, an uplink that is down).
	Idle map[string]string `json:"idle,omitempty"`
}

// Report is the status of the parts a component knows about.
type Report struct {
	Kernel string   `json:"kernel,omitempty"`
	Parts  []Status `json:"parts"`
}

// Set records a part's status, replacing an earlier one.
func (r *Report) Set(s Status) {
	for i := range r.Parts {
		if r.Parts[i].Part == s.Part {
			r.Parts[i] = s
			return
		}
	}
	r.Parts = append(r.Parts, s)
}

// On records a running part.
func (r *Report) On(p Name, via string) { r.Set(Status{Part: p, Runs: true, Via: via}) }

// Off records a part that does not run, the kind of why (code) and why.
func (r *Report) Off(p Name, code Code, reason string) {
	r.Set(Status{Part: p, Code: code, Reason: reason})
}

// OffErr records a part that does not run because of err (CodeOf).
func (r *Report) OffErr(p Name, err error) { r.Off(p, CodeOf(err), err.Error()) }

// Merge copies every status of o into r.
func (r *Report) Merge(o Report) {
	for _, s := range o.Parts {
		r.Set(s)
	}
}

// Get returns a part's status; ok false when the part was not reported.
func (r Report) Get(p Name) (Status, bool) {
	for _, s := range r.Parts {
		if s.Part == p {
			return s, true
		}
	}
	return Status{}, false
}

// Runs reports whether a part was recorded as running.
func (r Report) Runs(p Name) bool {
	s, ok := r.Get(p)
	return ok && s.Runs
}

// Sorted returns the statuses in the order of All.
func (r Report) Sorted() []Status {
	var out []Status
	for _, p := range All {
		if s, ok := r.Get(p); ok {
			out = append(out, s)
		}
	}
	return out
}

// ErrNoReport: no agent has written a report at that path.
var ErrNoReport = errors.New("no parts report (no agent has run with this pin path since boot)")

// Write stores the report at path atomically.
func (r Report) Write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Read loads a report Write stored.
func Read(path string) (Report, error) {
	var r Report
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, ErrNoReport
	}
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(data, &r)
}
