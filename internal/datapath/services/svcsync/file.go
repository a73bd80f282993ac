package svcsync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
)

// File is the services file (YAML or JSON) for hosts without Kubernetes:
//
//	services:
//	- name: web            # groups frontends; a change rewrites this name's only
//	  ip: 10.96.0.10       # ClusterIP, IPv4 or IPv6
//	  port: 80
//	  protocol: TCP        # TCP (default) or UDP
//	  backends: ["10.77.1.2:8080", "10.77.1.3:8080"]   # none: connects refused
//	  affinitySeconds: 10800   # sessionAffinity ClientIP timeout; 0 (default): none
//	  draining: ["10.77.1.4:8080"]   # still alive, chosen no more (as terminating endpoints):
//	                           # a backend leaving backends keeps its TCP connections only if listed here
//	  nodePort: 30080          # also a NodePort (with `run --nodeport`); 0 (default): none
//	  externalTrafficPolicy: Local   # Cluster (default) or Local
//	  localBackends: ["10.77.1.2:8080"]  # of backends, the node's own (Local)
//	proxied:                 # pods left to their proxy (proxied.go); a bad entry fails the file
//	- cgroup: /sys/fs/cgroup/pods/a    # the pod's cgroup v2 directory (its processes in it or below)
//	  choice: "proxy:1337"   # proxy (default: the proxy is outside the pod) or proxy:<the in-pod proxy's uid>
type File struct {
	Services []FileService `yaml:"services" json:"services"`
	Proxied  []FileProxied `yaml:"proxied,omitempty" json:"proxied,omitempty"`
}

// FileService is one frontend of the services file.
type FileService struct {
	Name     string   `yaml:"name" json:"name"`
	IP       string   `yaml:"ip" json:"ip"`
	Port     int      `yaml:"port" json:"port"`
	Protocol string   `yaml:"protocol,omitempty" json:"protocol,omitempty"`
	Backends []string `yaml:"backends" json:"backends"`
	Draining []string `yaml:"draining,omitempty" json:"draining,omitempty"`
	Affinity int      `yaml:"affinitySeconds,omitempty" json:"affinitySeconds,omitempty"`
	NodePort int      `yaml:"nodePort,omitempty" json:"nodePort,omitempty"`
	ETP      string   `yaml:"externalTrafficPolicy,omitempty" json:"externalTrafficPolicy,omitempty"`
	Local    []string `yaml:"localBackends,omitempty" json:"localBackends,omitempty"`
}

// ParseFile parses a services file into entries by name. A document that
// does not parse is an error; a bad entry is skipped and its reason
// returned under its name (as for bad Service objects).
func ParseFile(data []byte, fam Families) (map[string]Entries, map[string][]string, error) {
	byName, skipped, _, err := parseFile(data, fam)
	return byName, skipped, err
}

// parseFile is ParseFile with the file's pods left to their proxy.
func parseFile(data []byte, fam Families) (map[string]Entries, map[string][]string, []lb.Proxied, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, nil, err
	}
	proxied, err := fileProxied(f.Proxied)
	if err != nil {
		return nil, nil, nil, err
	}
	out := map[string]Entries{}
	skipped := map[string][]string{}
	for i, s := range f.Services {
		if s.Name == "" {
			return nil, nil, nil, fmt.Errorf("services[%d]: no name", i)
		}
		if out[s.Name] == nil {
			out[s.Name] = Entries{}
		}
		e, reason := fileEntry(s, fam)
		if reason != "" {
			skipped[s.Name] = append(skipped[s.Name], reason)
			continue
		}
		for fe, tg := range e {
			prev := out[s.Name][fe]
			out[s.Name][fe] = lb.Target{Backends: append(prev.Backends, tg.Backends...), Listed: append(prev.Listed, tg.Listed...),
				Affinity: max(prev.Affinity, tg.Affinity), KeepSource: prev.KeepSource || tg.KeepSource}
		}
	}
	return out, skipped, proxied, nil
}

func fileEntry(s FileService, fam Families) (Entries, string) {
	vip, err := netip.ParseAddr(s.IP)
	if err != nil || vip.Zone() != "" || vip.IsUnspecified() {
		return nil, SkipBadAddress
	}
	vip = vip.Unmap()
	if !fam.has(vip) {
		return nil, SkipFamily
	}
	var proto lb.Proto
	switch strings.ToUpper(s.Protocol) {
	case "", "TCP":
		proto = lb.TCP
	case "UDP":
		proto = lb.UDP
	default:
		return nil, SkipProtocol
	}
	if s.Port <= 0 || s.Port > 65535 {
		return nil, SkipNoPorts
	}
	if s.Affinity < 0 || time.Duration(s.Affinity)*time.Second > lb.MaxAffinity {
		return nil, SkipBadAddress
	}
	var bes []lb.Backend
	for _, b := range s.Backends {
		ap, err := netip.ParseAddrPort(b)
		if err != nil || ap.Port() == 0 || ap.Addr().Unmap().Is4() != vip.Is4() {
			return nil, SkipBadAddress
		}
		bes = append(bes, ap)
	}
	var draining []lb.Backend
	for _, b := range s.Draining {
		ap, err := netip.ParseAddrPort(b)
		if err != nil || ap.Port() == 0 || ap.Addr().Unmap().Is4() != vip.Is4() {
			return nil, SkipBadAddress
		}
		draining = append(draining, ap)
	}
	e := Entries{{Addr: vip, Port: uint16(s.Port), Proto: proto}: {Backends: bes, Listed: draining, Affinity: time.Duration(s.Affinity) * time.Second}}
	if s.NodePort == 0 {
		if s.ETP != "" || len(s.Local) > 0 {
			return nil, SkipBadAddress
		}
		return e, ""
	}
	if s.NodePort < 0 || s.NodePort > 65535 {
		return nil, SkipNoPorts
	}
	np := lb.Frontend{Addr: netip.IPv4Unspecified(), Port: uint16(s.NodePort), Proto: proto, NodePort: true}
	if vip.Is6() {
		np.Addr = netip.IPv6Unspecified()
	}
	switch s.ETP {
	case "", "Cluster":
		e[np] = lb.Target{Backends: bes}
	case "Local":
		var local []lb.Backend
		for _, b := range s.Local {
			ap, err := netip.ParseAddrPort(b)
			if err != nil || !slices.Contains(bes, ap) {
				return nil, SkipBadAddress // a local backend must be one of backends
			}
			local = append(local, ap)
		}
		e[np] = lb.Target{Backends: local, KeepSource: true}
	default:
		return nil, SkipBadAddress
	}
	return e, ""
}

// FilePoll is how often RunFile looks at the file.
const FilePoll = 500 * time.Millisecond

// RunFile applies path to t now (an error if it cannot be read or parsed)
// and then whenever its content changes, until ctx ends. Later read or
// parse errors are logged and keep what is written.
func RunFile(ctx context.Context, path string, fam Families, t *Table, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	var last []byte
	load := func() error {
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("services file: %w", err)
		}
		if last != nil && bytes.Equal(data, last) {
			return nil
		}
		since := time.Now()
		last = data // a bad content is reported once, not at every poll
		byName, skipped, proxied, err := parseFile(data, fam)
		if err != nil {
			return fmt.Errorf("services file %s: %w", path, err)
		}
		if len(skipped) > 0 {
			log.Warn("services file: entries skipped", "file", path, "skipped", skipped)
		}
		for _, name := range t.Names() {
			if _, ok := byName[name]; !ok {
				t.Apply(name, nil, nil, since)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(byName)) { // one order every time
			t.Apply(name, byName[name], skipped[name], since)
		}
		t.SetProxied(proxied, 0)
		log.Info("services file applied", "file", path, "services", len(byName))
		return nil
	}
	if err := load(); err != nil {
		return err
	}
	go every(ctx, FilePoll, func() {
		if err := load(); err != nil {
			log.Warn("services file: keeping what is written", "err", err)
		}
	})
	return nil
}
