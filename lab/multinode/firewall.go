package multinode

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/eztunnel/eztunnel/lab/netlab"
)

// The node firewall, per family (iptables and ip6tables in the node's
// namespace), kept as simple as kube-proxy's and Flannel's layout:
//
//	filter FORWARD (policy Options.ForwardPolicy) -> EZL-FORWARD:
//	  (IPv6: accept neighbour solicitations and advertisements)
//	  -j EZL-POLICY                        rules added by Block
//	  ctstate INVALID -j DROP
//	  ctstate RELATED,ESTABLISHED -j ACCEPT
//	  -s <cluster> -j ACCEPT; -d <cluster> -j ACCEPT
//	nat PREROUTING, OUTPUT -> EZL-SERVICES: per service
//	  -d VIP -p proto --dport port -j EZL-SVC-<NAME>
//	  EZL-SVC-<NAME>: -m statistic random -> EZL-SEP-<NAME>-<i> (DNAT)
//	nat POSTROUTING -> EZL-POSTROUTING:
//	  -s <cluster> -d <cluster> -j RETURN
//	  -s <cluster> ! -d <multicast> -j MASQUERADE
//
// Everything is in both families. Bridged pod-to-pod traffic of one node
// passes FORWARD too (bridge-nf-call-ip{,6}tables=1 in the node).
// Not modelled: hairpin masquerade of a backend reaching its own service,
// NodePorts, and ClusterIP from the external host.
const (
	chainForward  = "EZL-FORWARD"
	chainPolicy   = "EZL-POLICY"
	chainServices = "EZL-SERVICES"
	chainPost     = "EZL-POSTROUTING"
)

// iptablesWait is how long iptables waits for the xtables lock, which is
// shared by every namespace of the host.
const iptablesWait = "30"

type family struct {
	v6                bool
	iptables, restore string
	cluster           netip.Prefix
	multicast         string
}

var families = []family{
	{false, "iptables", "iptables-restore", ClusterV4, "224.0.0.0/4"},
	{true, "ip6tables", "ip6tables-restore", ClusterV6, "ff00::/8"},
}

func familyOf(a netip.Addr) family {
	if a.Is6() && !a.Is4In6() {
		return families[1]
	}
	return families[0]
}

func (n *Node) restore(f family, rules string, noflush bool) error {
	args := []string{"-w", iptablesWait}
	if noflush {
		args = append(args, "--noflush")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := netlab.NetnsCmd(ctx, n.NetNS, f.restore, args...)
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s in %s: %v: %s\n%s", f.restore, n.NetNS, err, bytes.TrimSpace(out), rules)
	}
	return nil
}

func (n *Node) iptables(f family, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := netlab.NetnsCmd(ctx, n.NetNS, f.iptables, append([]string{"-w", iptablesWait}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s in %s: %v: %s", f.iptables, strings.Join(args, " "), n.NetNS, err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

func (n *Node) mkFirewall() error {
	for _, f := range families {
		var b strings.Builder
		p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
		p("*filter")
		p(":FORWARD %s [0:0]", n.lab.ForwardPolicy)
		p(":%s - [0:0]", chainForward)
		p(":%s - [0:0]", chainPolicy)
		p("-A FORWARD -j %s", chainForward)
		if f.v6 {
			// Neighbour discovery between pods of a node is bridged through
			// FORWARD. It passes before the policy rules (whose unicast
			// probes would match a pod-to-pod rule, as ARP never does) and
			// before INVALID (conntrack does not track it).
			p("-A %s -p ipv6-icmp --icmpv6-type neighbour-solicitation -j ACCEPT", chainForward)
			p("-A %s -p ipv6-icmp --icmpv6-type neighbour-advertisement -j ACCEPT", chainForward)
		}
		p("-A %s -j %s", chainForward, chainPolicy)
		p("-A %s -m conntrack --ctstate INVALID -j DROP", chainForward)
		p("-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", chainForward)
		p("-A %s -s %s -j ACCEPT", chainForward, f.cluster)
		p("-A %s -d %s -j ACCEPT", chainForward, f.cluster)
		p("COMMIT")
		p("*nat")
		p(":%s - [0:0]", chainServices)
		p(":%s - [0:0]", chainPost)
		p("-A PREROUTING -j %s", chainServices)
		p("-A OUTPUT -j %s", chainServices)
		p("-A POSTROUTING -j %s", chainPost)
		p("-A %s -s %s -d %s -j RETURN", chainPost, f.cluster, f.cluster)
		p("-A %s -s %s ! -d %s -j MASQUERADE", chainPost, f.cluster, f.multicast)
		p("COMMIT")
		if err := n.restore(f, b.String(), false); err != nil {
			return err
		}
	}
	return nil
}

// Verdict of a FORWARD rule.
type Verdict string

const (
	Drop Verdict = "DROP"
	// Reject answers with ICMP port unreachable (ICMPv6 port unreachable):
	// a TCP connect fails with ECONNREFUSED.
	Reject Verdict = "REJECT"
)

var ruleSeq atomic.Uint64

// Rule is a FORWARD rule in a node's EZL-POLICY chain, one or more
// families.
type Rule struct {
	Node    *Node
	Verdict Verdict
	Comment string // ezl-rule-<n>, marks its lines in iptables -L
	specs   []ruleSpec
}

type ruleSpec struct {
	f    family
	args []string
}

// Block adds a FORWARD rule on node n: packets from src to dst (both of one
// family) get verdict v, new and established flows alike. Remove undoes it.
func (n *Node) Block(src, dst netip.Prefix, v Verdict) (*Rule, error) {
	if v != Drop && v != Reject {
		return nil, fmt.Errorf("multinode: verdict %q: want %s or %s", v, Drop, Reject)
	}
	if !src.IsValid() || !dst.IsValid() || src.Addr().Is4() != dst.Addr().Is4() {
		return nil, fmt.Errorf("multinode: rule %s -> %s: want two prefixes of one family", src, dst)
	}
	r := &Rule{Node: n, Verdict: v, Comment: fmt.Sprintf("ezl-rule-%d", ruleSeq.Add(1))}
	if err := r.add(src, dst); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Rule) add(src, dst netip.Prefix) error {
	f := familyOf(src.Addr())
	args := []string{chainPolicy, "-s", src.String(), "-d", dst.String(), "-m", "comment", "--comment", r.Comment, "-j", string(r.Verdict)}
	if _, err := r.Node.iptables(f, append([]string{"-A"}, args...)...); err != nil {
		return err
	}
	r.specs = append(r.specs, ruleSpec{f, args})
	return nil
}

// Remove deletes the rule's lines.
func (r *Rule) Remove() error {
	for len(r.specs) > 0 {
		s := r.specs[len(r.specs)-1]
		if _, err := r.Node.iptables(s.f, append([]string{"-D"}, s.args...)...); err != nil {
			return err
		}
		r.specs = r.specs[:len(r.specs)-1]
	}
	return nil
}

// Packets is how many packets the rule has matched, all families summed.
func (r *Rule) Packets() (uint64, error) {
	var sum uint64
	seen := map[bool]bool{}
	for _, s := range r.specs {
		if seen[s.f.v6] {
			continue
		}
		seen[s.f.v6] = true
		out, err := r.Node.iptables(s.f, "-L", chainPolicy, "-n", "-v", "-x")
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, "/* "+r.Comment+" */") {
				continue
			}
			fs := strings.Fields(line)
			v, err := strconv.ParseUint(fs[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("multinode: counters of %s: %q", r.Comment, line)
			}
			sum += v
		}
	}
	return sum, nil
}

// Service is a kube-proxy-style ClusterIP: VIPv4:Port and [VIPv6]:Port
// DNATed on every node to a random backend pod's TargetPort.
type Service struct {
	Name         string
	Proto        string // tcp or udp
	VIPv4, VIPv6 netip.Addr
	Port         int
	TargetPort   int
	Backends     []*Pod
	lab          *Lab
	chain        string
}

var svcNameRE = regexp.MustCompile(`^[a-z0-9]{1,12}$`)

// AddService programs a ClusterIP on every node: the next free VIPs of
// ServiceV4 and ServiceV6, port to targetPort on the backends.
func (l *Lab) AddService(name, proto string, port, targetPort int, backends ...*Pod) (*Service, error) {
	if !svcNameRE.MatchString(name) {
		return nil, fmt.Errorf("multinode: service name %q must be 1..12 characters of [a-z0-9]", name)
	}
	if proto != "tcp" && proto != "udp" {
		return nil, fmt.Errorf("multinode: service protocol %q: want tcp or udp", proto)
	}
	if port < 1 || port > 65535 || targetPort < 1 || targetPort > 65535 {
		return nil, fmt.Errorf("multinode: service ports %d -> %d out of range 1..65535", port, targetPort)
	}
	if len(backends) == 0 {
		return nil, fmt.Errorf("multinode: service %s has no backends", name)
	}
	l.mu.Lock()
	k := len(l.services) + 10
	for _, s := range l.services {
		if s.Name == name {
			l.mu.Unlock()
			return nil, fmt.Errorf("multinode: service %s exists already", name)
		}
		if i := int(s.VIPv4.As4()[3]) + int(s.VIPv4.As4()[2])<<8; i >= k {
			k = i + 1
		}
	}
	l.mu.Unlock()
	if k > 65000 {
		return nil, fmt.Errorf("multinode: out of ClusterIPs")
	}
	s := &Service{
		Name: name, Proto: proto, Port: port, TargetPort: targetPort, Backends: backends, lab: l,
		VIPv4: nth(ServiceV4, k), VIPv6: nth(ServiceV6, k),
		chain: "EZL-SVC-" + strings.ToUpper(name),
	}
	for _, n := range l.Nodes {
		for _, f := range families {
			if err := n.restore(f, s.rules(f, true), true); err != nil {
				s.remove(l.Nodes)
				return nil, fmt.Errorf("multinode: service %s: %w", name, err)
			}
		}
	}
	l.mu.Lock()
	l.services = append(l.services, s)
	l.mu.Unlock()
	return s, nil
}

func (s *Service) sep(i int) string {
	return fmt.Sprintf("%s-%d", strings.Replace(s.chain, "SVC", "SEP", 1), i)
}

func (s *Service) vip(f family) netip.Addr {
	if f.v6 {
		return s.VIPv6
	}
	return s.VIPv4
}

func (s *Service) jump(f family) string {
	vip := s.vip(f)
	return fmt.Sprintf("%s -d %s -p %s -m %s --dport %d -j %s", chainServices, netip.PrefixFrom(vip, vip.BitLen()), s.Proto, s.Proto, s.Port, s.chain)
}

// rules is the iptables-restore input adding (or removing) the service.
func (s *Service) rules(f family, add bool) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("*nat")
	// Declaring a chain creates or flushes it.
	p(":%s - [0:0]", s.chain)
	for i := range s.Backends {
		p(":%s - [0:0]", s.sep(i))
	}
	if !add {
		p("-D %s", s.jump(f))
		p("-X %s", s.chain)
		for i := range s.Backends {
			p("-X %s", s.sep(i))
		}
		p("COMMIT")
		return b.String()
	}
	for i, be := range s.Backends {
		if left := len(s.Backends) - i; left > 1 {
			p("-A %s -m statistic --mode random --probability %.5f -j %s", s.chain, 1/float64(left), s.sep(i))
		} else {
			p("-A %s -j %s", s.chain, s.sep(i))
		}
		to := fmt.Sprintf("%s:%d", be.IPv4, s.TargetPort)
		if f.v6 {
			to = fmt.Sprintf("[%s]:%d", be.IPv6, s.TargetPort)
		}
		p("-A %s -p %s -j DNAT --to-destination %s", s.sep(i), s.Proto, to)
	}
	p("-A %s", s.jump(f))
	p("COMMIT")
	return b.String()
}

func (s *Service) remove(nodes []*Node) error {
	var first error
	for _, n := range nodes {
		for _, f := range families {
			if err := n.restore(f, s.rules(f, false), true); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// Remove deletes the service from every node.
func (s *Service) Remove() error {
	l := s.lab
	l.mu.Lock()
	for i, x := range l.services {
		if x == s {
			l.services = append(l.services[:i], l.services[i+1:]...)
			break
		}
	}
	l.mu.Unlock()
	return s.remove(l.Nodes)
}

// Services returns the services in creation order.
func (l *Lab) Services() []*Service {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Service(nil), l.services...)
}

// Addr returns the service's IPv4 (v6 false) or IPv6 ClusterIP.
func (s *Service) Addr(v6 bool) netip.Addr {
	if v6 {
		return s.VIPv6
	}
	return s.VIPv4
}
