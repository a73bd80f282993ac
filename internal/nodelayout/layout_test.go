package nodelayout

import "testing"

// TestNames: the names earlier builds used, so an upgrade finds the lock,
// report and log of the agent before it; a run directory moves them all.
func TestNames(t *testing.T) {
	def, lab := Layout{PinRoot: "/sys/fs/bpf/eztunnel"}, Layout{PinRoot: "/sys/fs/bpf/lab-x"}
	moved := Layout{PinRoot: "/sys/fs/bpf/eztunnel/", RunDir: "/var/run/ez"}
	for _, c := range []struct{ got, want string }{
		{def.Pins(), "/sys/fs/bpf/eztunnel/v2"},
		{def.Lock(), "/run/eztunnel/agent.lock"},
		{Layout{PinRoot: "/sys/fs/bpf/eztunnel/"}.Lock(), "/run/eztunnel/agent.lock"},
		{lab.Lock(), "/run/eztunnel/agent-sys_fs_bpf_lab-x.lock"},
		{def.Report(), "/run/eztunnel/sys_fs_bpf_eztunnel_v2.parts.json"},
		{def.Log(), "/run/eztunnel/sys_fs_bpf_eztunnel_v2.log"},
		{def.LogLevel(), "/run/eztunnel/sys_fs_bpf_eztunnel_v2.loglevel"},
		{def.Socket(), "/run/eztunnel/sys_fs_bpf_eztunnel_v2.sock"},
		{moved.Lock(), "/var/run/ez/agent.lock"},
		{moved.Report(), "/var/run/ez/sys_fs_bpf_eztunnel_v2.parts.json"},
		{moved.Log(), "/var/run/ez/sys_fs_bpf_eztunnel_v2.log"},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
	if def.Report() == (Layout{PinRoot: "/sys/fs/bpf/other"}).Report() {
		t.Error("two datapaths share a report")
	}
}
