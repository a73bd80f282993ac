package k8scluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

func (c *Cluster) startContainerd(ctx context.Context) error {
	for _, d := range []string{"containerd/root", "containerd/state", "cni/net.d", "cni/ipam"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return err
		}
	}
	c.sock = c.path("containerd/containerd.sock")
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": %q,
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, cniNetwork, BridgeLink, PodCIDR, c.path("cni/ipam"))
	if err := os.WriteFile(c.path("cni/net.d/10-ezk8s.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	// restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and runc
	// fails every sandbox ("can't get final child's PID from pipe: EOF")
	// when asked to lower oom_score_adj.
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, c.path("containerd/root"), c.path("containerd/state"), c.sock, c.sock+".ttrpc",
		PauseImage, c.path("cni/net.d"), c.path("containerd/opt"))
	path := c.path("containerd.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return err
	}
	if err := c.spawn("containerd", "containerd", "--config", path, "--log-level", "warn"); err != nil {
		return err
	}
	if err := c.wait(ctx, "containerd", 30*time.Second, func() error {
		_, err := c.ctr(ctx, "version")
		return err
	}); err != nil {
		return err
	}
	return c.ImportImage(ctx, c.cfg.PauseTar)
}

func (c *Cluster) ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := sysexec.Command(ctx, "ctr", append([]string{"--address", c.sock, "-n", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// ImportImage imports an OCI archive into the CRI namespace; its images
// keep the names their index gives them.
func (c *Cluster) ImportImage(ctx context.Context, tar string) error {
	_, err := c.ctr(ctx, "images", "import", tar)
	return err
}
