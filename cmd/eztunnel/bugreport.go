package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// bugreportCmd writes one archive an operator attaches to an issue.
func bugreportCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var out, lockFile, kubeconfig string
	cmd := &cobra.Command{
		Use:   "bugreport",
		Short: "Write one .tar.gz to attach to an issue: version, preflight, status, connections, the agent's recent log, its pod, DaemonSet and their events (in the agent's pod), pinned objects, kernel settings (changes nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "-" {
				// In a pod whose root is read-only: `kubectl exec ... --
				// eztunnel bugreport -f - > report.tar.gz`.
				files, err := writeBugreport(cmd.OutOrStdout(), cfg, lockFile, kubeconfig)
				if err != nil {
					return fmt.Errorf("bugreport: %w", err)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "bugreport: %s\n", strings.Join(files, ", "))
				return nil
			}
			if out == "" {
				host, _ := os.Hostname()
				out = fmt.Sprintf("eztunnel-bugreport-%s-%s.tar.gz", host, time.Now().UTC().Format("20060102T150405Z"))
			}
			f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("bugreport: %w", err)
			}
			files, werr := writeBugreport(f, cfg, lockFile, kubeconfig)
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				os.Remove(out)
				return fmt.Errorf("bugreport: %w", werr)
			}
			fmt.Printf("%s: %s\n", out, strings.Join(files, ", "))
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "file", "f", "", "the archive to write (default: eztunnel-bugreport-<host>-<time>.tar.gz here; never overwritten); - writes it to standard output")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "the kubeconfig for the Kubernetes view (default: the pod's service account)")
	layoutFlags(cmd.Flags(), &cfg, &lockFile)
	return cmd
}

// writeBugreport writes the archive to w and returns the names of its
// files. A section that cannot be read is recorded in errors.txt; only
// writing the archive can fail.
func writeBugreport(w io.Writer, cfg datapath.Config, lockFile, kubeconfig string) ([]string, error) {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	now := time.Now()
	var names []string
	var problems []string
	put := func(name string, data []byte) error {
		names = append(names, name)
		if err := tw.WriteHeader(&tar.Header{Name: "eztunnel-bugreport/" + name, Mode: 0o644, Size: int64(len(data)), ModTime: now}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	putJSON := func(name string, v any, err error) error {
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			return nil
		}
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			return nil
		}
		return put(name, append(b, '\n'))
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		problems = append(problems, "remove memlock limit: "+err.Error())
	}
	v, verr := readVersion(cfg, lockFile)
	st, serr := readStatus(cfg, lockFile)
	var (
		conns []datapath.Connection
		total int
	)
	l, cerr := listConnections(context.Background(), cfg, false, func(c datapath.Connection) error {
		if total++; len(conns) < 1000 {
			conns = append(conns, c)
		}
		return nil
	})
	summary := map[string]any{"total": total, "via": l.Via, "unlisted_namespaces": l.Unlisted}
	if total > 1000 {
		summary["listed"] = 1000
	}
	summary["connections"] = conns
	for _, s := range []struct {
		name string
		v    any
		err  error
	}{
		{"version.json", v, verr},
		{"preflight.json", preflight(), nil},
		{"status.json", st, serr},
		{"connections.json", summary, cerr},
	} {
		if err := putJSON(s.name, s.v, s.err); err != nil {
			return names, err
		}
	}
	if b, err := os.ReadFile(cfg.Layout().Log()); err == nil {
		if err := put("agent.log", b); err != nil {
			return names, err
		}
	} else {
		problems = append(problems, "agent.log: "+err.Error())
	}
	for _, f := range kubeView(context.Background(), kubeconfig) {
		if f.err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", f.name, f.err))
			continue
		}
		if err := put(f.name, f.data); err != nil {
			return names, err
		}
	}
	if err := put("pins.txt", pinnedObjects(cfg.Dir())); err != nil {
		return names, err
	}
	if err := put("kernel.txt", kernelSettings()); err != nil {
		return names, err
	}
	if len(problems) > 0 {
		if err := put("errors.txt", []byte(strings.Join(problems, "\n")+"\n")); err != nil {
			return names, err
		}
	}
	if err := tw.Close(); err != nil {
		return names, err
	}
	return names, gz.Close()
}

// pinnedObjects lists what is pinned under dir: each pin with its kind and
// the kernel's name and id for it.
func pinnedObjects(dir string) []byte {
	var b bytes.Buffer
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
			if info, err := m.Info(); err == nil {
				id, _ := info.ID()
				fmt.Fprintf(&b, "%s\tmap %s %s id %d max_entries %d\n", rel, info.Type, info.Name, id, info.MaxEntries)
			}
			m.Close()
			return nil
		}
		if p, err := ebpf.LoadPinnedProgram(path, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
			if info, err := p.Info(); err == nil {
				id, _ := info.ID()
				fmt.Fprintf(&b, "%s\tprogram %s %s id %d tag %s\n", rel, info.Type, info.Name, id, info.Tag)
			}
			p.Close()
			return nil
		}
		if l, err := link.LoadPinnedLink(path, &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
			if info, err := l.Info(); err == nil {
				fmt.Fprintf(&b, "%s\tlink %v id %d program %d\n", rel, info.Type, info.ID, info.Program)
			}
			l.Close()
			return nil
		}
		fmt.Fprintf(&b, "%s\t?\n", rel)
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(&b, "nothing pinned in %s\n", dir)
	} else if err != nil {
		fmt.Fprintf(&b, "walking %s: %v\n", dir, err)
	}
	return b.Bytes()
}

// kernelSettings are the kernel facts the parts depend on.
func kernelSettings() []byte {
	var b bytes.Buffer
	for _, f := range []string{"/proc/version", "/proc/sys/kernel/unprivileged_bpf_disabled", "/proc/sys/net/core/bpf_jit_enable",
		"/proc/sys/net/core/bpf_jit_harden", "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal", "/proc/sys/net/ipv4/ip_forward",
		"/proc/sys/net/bridge/bridge-nf-call-iptables", "/proc/sys/net/ipv4/tcp_mem", "/proc/sys/net/ipv4/tcp_rmem"} {
		v, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", f, err)
			continue
		}
		fmt.Fprintf(&b, "%s: %s\n", f, strings.TrimSpace(string(v)))
	}
	for _, f := range []struct{ path, keep string }{{"/proc/modules", "nf_conntrack nf_nat cls_bpf sch_ingress br_netfilter veth vxlan bridge"}, {"/proc/mounts", "bpf cgroup2"}} {
		data, err := os.ReadFile(f.path)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", f.path, err)
			continue
		}
		fmt.Fprintf(&b, "%s:\n", f.path)
		keep := strings.Fields(f.keep)
		for _, line := range strings.Split(string(data), "\n") {
			fields := strings.Fields(line)
			if len(fields) < 3 {
				continue
			}
			for _, k := range keep {
				if fields[0] == k || fields[2] == k {
					fmt.Fprintf(&b, "  %s\n", line)
					break
				}
			}
		}
	}
	return b.Bytes()
}
