// Package nodelayout names every path one datapath has on a node: its pins
// under the pin root (bpffs: the schema directory; each family keeps its
// own directory in it) and its agent's files under the run directory (tmpfs,
// /run/eztunnel by default: the lock, the parts report, the recent log, the
// agent's local API socket; a hostPath in the DaemonSet, shared by every
// agent pod of the node). Both
// are gone at reboot. The run files are named for the pinned datapath, so
// agents with different pin roots (tests, labs) share none. Every command,
// the agent and the chart (its --run-dir) build paths here only.
package nodelayout

import (
	"path/filepath"
	"strings"
)

const (
	// DefaultPinRoot is where the datapath is pinned unless configured otherwise.
	DefaultPinRoot = "/sys/fs/bpf/eztunnel"
	// DefaultRunDir holds the agents' files unless configured otherwise.
	DefaultRunDir = "/run/eztunnel"
	// Schema names the layout of the pinned maps, the directory under the
	// pin root they live in. Bump it whenever a map's key, value or type
	// changes; a datapath pinned under another schema is refused.
	Schema = "v2"
)

// Layout is one datapath's paths on the node.
type Layout struct {
	PinRoot string // bpffs directory (--pin-path)
	RunDir  string // the agents' files (--run-dir); "" is DefaultRunDir
}

// Pins is the schema's directory: every pin of the datapath is below it.
func (l Layout) Pins() string { return filepath.Join(l.PinRoot, Schema) }

// Lock is the lock file that keeps one agent per datapath (internal/agentlock):
// agent.lock for the default pin root, a name after the pin root otherwise.
func (l Layout) Lock() string {
	if filepath.Clean(l.PinRoot) == DefaultPinRoot {
		return filepath.Join(l.runDir(), "agent.lock")
	}
	name := strings.Trim(strings.ReplaceAll(filepath.Clean(l.PinRoot), "/", "_"), "_")
	return filepath.Join(l.runDir(), "agent-"+name+".lock")
}

// Report is where the agent writes its parts report (internal/parts).
func (l Layout) Report() string { return filepath.Join(l.runDir(), l.pinName()+".parts.json") }

// Log is the agent's recent log (internal/agentlog), for `eztunnel bugreport`.
func (l Layout) Log() string { return filepath.Join(l.runDir(), l.pinName()+".log") }

// LogLevel is the log level `eztunnel log-level` asks the agent for (it
// reads it on SIGUSR2).
func (l Layout) LogLevel() string { return filepath.Join(l.runDir(), l.pinName()+".loglevel") }

// Socket is the running agent's local API (internal/agentapi): `eztunnel
// status` and `connections` ask the agent there.
func (l Layout) Socket() string { return filepath.Join(l.runDir(), l.pinName()+".sock") }

func (l Layout) runDir() string {
	if l.RunDir == "" {
		return DefaultRunDir
	}
	return l.RunDir
}

func (l Layout) pinName() string {
	return strings.ReplaceAll(strings.Trim(l.Pins(), "/"), "/", "_")
}
