package svcsync

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
)

// Per-pod choice of the Service load balancer (the eztunnel.io/services pod
// annotation; the services file's proxied entries):
//
//	socket       translate at the socket (the default, as without the annotation);
//	             a proxy that intercepted a connection still learns the ClusterIP
//	             (SO_ORIGINAL_DST answered by cgroup/getsockopt)
//	proxy        leave the pod's TCP connects to ClusterIPs to a proxy outside the
//	             pod (a node proxy): none is translated at the socket
//	proxy:UID    leave them to the pod's own proxy, which runs as UID (Istio 1337,
//	             Linkerd 2102): the proxy's own connects are translated
const (
	ChoiceSocket = "socket"
	ChoiceProxy  = "proxy"
)

// ParseChoice parses a choice; proxied is false for socket.
func ParseChoice(v string) (proxied bool, uid uint32, hasUID bool, err error) {
	switch {
	case v == ChoiceSocket:
		return false, 0, false, nil
	case v == ChoiceProxy:
		return true, 0, false, nil
	case strings.HasPrefix(v, ChoiceProxy+":"):
		n, err := strconv.ParseUint(v[len(ChoiceProxy)+1:], 10, 32)
		if err != nil || n == 1<<32-1 { // (uid_t)-1 is no uid
			return false, 0, false, fmt.Errorf("choice %q: the proxy's uid must be a number below 4294967295", v)
		}
		return true, uint32(n), true, nil
	}
	return false, 0, false, fmt.Errorf("choice %q: want %s, %s or %s:<proxy uid>", v, ChoiceSocket, ChoiceProxy, ChoiceProxy)
}

// FileProxied is a pod of the services file left to its proxy.
type FileProxied struct {
	Cgroup string `yaml:"cgroup" json:"cgroup"` // the pod's cgroup v2 directory, absolute
	// Choice: proxy or proxy:UID (ParseChoice); "" is proxy.
	Choice string `yaml:"choice,omitempty" json:"choice,omitempty"`
}

// fileProxied checks the file's proxied entries.
func fileProxied(fs []FileProxied) ([]lb.Proxied, error) {
	var out []lb.Proxied
	seen := map[string]bool{}
	for i, f := range fs {
		if !filepath.IsAbs(f.Cgroup) {
			return nil, fmt.Errorf("proxied[%d]: cgroup %q: want an absolute cgroup v2 directory", i, f.Cgroup)
		}
		c := f.Choice
		if c == "" {
			c = ChoiceProxy
		}
		proxied, uid, hasUID, err := ParseChoice(c)
		if err != nil {
			return nil, fmt.Errorf("proxied[%d]: %w", i, err)
		}
		if !proxied {
			continue
		}
		cg := filepath.Clean(f.Cgroup)
		if seen[cg] {
			return nil, fmt.Errorf("proxied[%d]: cgroup %s listed twice", i, cg)
		}
		seen[cg] = true
		out = append(out, lb.Proxied{Cgroup: cg, UID: uid, HasUID: hasUID})
	}
	return out, nil
}

// ProxyWriter writes the pods left to their proxy (the datapath's *services.LB).
type ProxyWriter interface {
	SetProxied([]lb.Proxied) error
}

// SetProxied makes ps the pods left to their proxy, when the Writer is a
// ProxyWriter; invalid is how many pods asked for a choice that does not
// parse (they keep the default). Errors are logged: the pods written stay.
func (t *Table) SetProxied(ps []lb.Proxied, invalid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pw, ok := t.w.(ProxyWriter)
	if !ok {
		return
	}
	if err := pw.SetProxied(ps); err != nil {
		t.log.Warn("services: pods left to their proxy", "err", err)
	}
	if t.m != nil {
		t.m.SetProxied(len(ps), invalid)
	}
}
