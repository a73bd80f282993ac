package netlab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// Cmd prepares a command to run in the pod's network namespace. Start it
// with Pod.Start or Pod.Run, which also place it in the pod's cgroup.
func (p *Pod) Cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	return NetnsCmd(ctx, p.NetNS, name, args...)
}

// Start starts cmd in the pod's cgroup.
func (p *Pod) Start(cmd *exec.Cmd) error { return StartInCgroup(cmd, p.Cgroup) }

// Run starts cmd in the pod's cgroup and waits for it.
func (p *Pod) Run(cmd *exec.Cmd) error { return RunInCgroup(cmd, p.Cgroup) }

// NetnsCmd prepares a command that nsenter moves into a named network
// namespace; unlike `ip netns exec`, nsenter does not remount /sys.
func NetnsCmd(ctx context.Context, netnsName, name string, args ...string) *exec.Cmd {
	// nsenter would search PATH: give it the file sysexec resolved.
	path, err := sysexec.Path(name)
	if err != nil {
		path = name
	}
	full := append([]string{"--net=/run/netns/" + netnsName, "--", path}, args...)
	cmd := sysexec.Command(ctx, "nsenter", full...)
	if err != nil && cmd.Err == nil {
		cmd.Err = err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// StartInCgroup starts cmd placed in cgroup from its first instruction
// (clone3 CLONE_INTO_CGROUP), so it is in its cgroup before it enters a netns.
func StartInCgroup(cmd *exec.Cmd, cgroup string) error {
	fd, err := os.Open(cgroup)
	if err != nil {
		return fmt.Errorf("netlab: open cgroup %s: %w", cgroup, err)
	}
	defer fd.Close()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(fd.Fd())
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("netlab: start %s: %w", cmd.Path, err)
	}
	return nil
}

// RunInCgroup is StartInCgroup, then waits for cmd.
func RunInCgroup(cmd *exec.Cmd, cgroup string) error {
	if err := StartInCgroup(cmd, cgroup); err != nil {
		return err
	}
	return cmd.Wait()
}
