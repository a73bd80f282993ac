package meshlab

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// Proc is a long-running process of the node: a server or a proxy.
type Proc struct {
	Name string
	Pod  *netlab.Pod
	cmd  *exec.Cmd
	out  logbuf.Buffer
	done chan struct{} // closed once Wait returned
}

// Pid of the process (for haproxy and nginx, the master).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

func (p *Proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Output is what the process wrote so far, for diagnostics.
func (p *Proc) Output() string { return p.out.String() }

// Cmd prepares argv in pod p; start it with Start.
func (n *Node) Cmd(ctx context.Context, p *netlab.Pod, argv ...string) *exec.Cmd {
	return p.Cmd(ctx, argv[0], argv[1:]...)
}

// Start starts cmd in pod p with the node's placement (CPU affinity and
// niceness set on the forking thread: the cgroup v2 cpuset controller is
// not always available, e.g. on hybrid cgroup layouts).
func (n *Node) Start(p *netlab.Pod, cmd *exec.Cmd) error {
	return n.cfg.Placement.Start(func() error { return p.Start(cmd) })
}

// start runs argv in pod p until the node closes and waits until every one
// of ports listens in p's netns.
func (n *Node) start(name string, p *netlab.Pod, ports []int, argv ...string) (*Proc, error) {
	pr := &Proc{Name: name, Pod: p, out: logbuf.Buffer{Limit: 1 << 20}, done: make(chan struct{})}
	pr.cmd = n.Cmd(n.ctx, p, argv...)
	pr.cmd.Stdout, pr.cmd.Stderr = &pr.out, &pr.out
	pr.cmd.WaitDelay = 2 * time.Second // children may hold the output pipe
	if err := n.Start(p, pr.cmd); err != nil {
		return nil, err
	}
	n.procs = append(n.procs, pr)
	go func() { pr.cmd.Wait(); close(pr.done) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		missing, err := p.NotListening(ports)
		if err == nil && len(missing) == 0 {
			return pr, nil
		}
		if pr.exited() {
			return nil, fmt.Errorf("%s in pod %s exited: %s", name, p.Name, tail(pr.Output()))
		}
		if n.ctx.Err() != nil {
			return nil, n.ctx.Err()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s in pod %s: ports %v not listening after 15s (%v): %s", name, p.Name, missing, err, tail(pr.Output()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}
