// Package noderun is the layout of the agent's files on the node under
// /run/eztunnel (tmpfs: gone at reboot, as the pins are; a hostPath in the
// DaemonSet, shared by every agent pod of the node). Each agent's files are
// named for its pinned datapath, so agents with different pin paths (tests,
// labs) share none.
package noderun

import (
	"path/filepath"
	"strings"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Dir holds every file below.
const Dir = "/run/eztunnel"

// Lock is the lock file that keeps one agent per datapath pinned under
// pinRoot (internal/agentlock): agent.lock for the default pin root.
func Lock(pinRoot string) string {
	if filepath.Clean(pinRoot) == bpfsys.DefaultPinRoot {
		return filepath.Join(Dir, "agent.lock")
	}
	name := strings.Trim(strings.ReplaceAll(filepath.Clean(pinRoot), "/", "_"), "_")
	return filepath.Join(Dir, "agent-"+name+".lock")
}

// Report is where the agent of the datapath pinned under pinDir (the
// schema's directory) writes its parts report (internal/parts).
func Report(pinDir string) string { return filepath.Join(Dir, pinName(pinDir)+".parts.json") }

// Log is that agent's recent log (internal/agentlog), for `eztunnel bugreport`.
func Log(pinDir string) string { return filepath.Join(Dir, pinName(pinDir)+".log") }

func pinName(pinDir string) string {
	return strings.ReplaceAll(strings.Trim(filepath.Clean(pinDir), "/"), "/", "_")
}
