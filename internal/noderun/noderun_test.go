package noderun

import "testing"

// TestNames: the names earlier builds used, so an upgrade finds the lock,
// report and log of the agent before it.
func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Lock("/sys/fs/bpf/eztunnel"), "/run/eztunnel/agent.lock"},
		{Lock("/sys/fs/bpf/eztunnel/"), "/run/eztunnel/agent.lock"},
		{Lock("/sys/fs/bpf/lab-x"), "/run/eztunnel/agent-sys_fs_bpf_lab-x.lock"},
		{Report("/sys/fs/bpf/eztunnel/v2"), "/run/eztunnel/sys_fs_bpf_eztunnel_v2.parts.json"},
		{Log("/sys/fs/bpf/eztunnel/v2/"), "/run/eztunnel/sys_fs_bpf_eztunnel_v2.log"},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
	if Report("/sys/fs/bpf/eztunnel/v2") == Report("/sys/fs/bpf/other/v2") {
		t.Error("two datapaths share a report")
	}
}
