package svcsync

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/spf13/pflag"

	"github.com/eztunnel/eztunnel/internal/kube"
)

// Options is `run --services`: ClusterIP load balancing at the
// socket, fed by a file or the Kubernetes API.
type Options struct {
	// On: --services. Off, a load balancer an earlier agent pinned is
	// removed.
	On         bool
	File       string // services file; "" = the Kubernetes API
	Kubeconfig string // "" = in-cluster configuration (without File)
	// NodePort: NodePorts on NodePortDevices (names; empty: discovered),
	// with NodeName's endpoints as the local ones (empty: the hostname).
	NodePort        bool
	NodePortDevices []string
	NodeName        string
	// HealthCheckAddrs: with NodePort and the Kubernetes API, where the
	// healthCheckNodePorts of LoadBalancer Services with
	// externalTrafficPolicy Local are served (hosts; empty: every address).
	HealthCheckAddrs []string
	// Pods is where the kubelet puts pod cgroups (PodsCgroup, Driver,
	// Cgroup2Root; zero: detected), for the pods of NodeName left to their
	// proxy (the eztunnel.io/services annotation) with the Kubernetes API.
	Pods kube.Config
}

// Register adds the load balancer's flags to f. --kubeconfig and
// --node-name are the Kubernetes flags the agent shares (Parse takes them).
func (o *Options) Register(f *pflag.FlagSet) {
	f.BoolVar(&o.On, "services", false, "Service load balancing, first slice: ClusterIP TCP and UDP translated to a backend at the socket (cgroup connect/sendmsg/recvmsg/getpeername on the managed cgroups; pinned with the datapath: translated sockets keep their translation across restarts; off removes a pinned one); fed by --services-file, else the Kubernetes API (--kubeconfig or in-cluster)")
	f.StringVar(&o.File, "services-file", "", "with --services: a YAML or JSON file of frontends and backends (hosts without Kubernetes), re-read when it changes")
	f.BoolVar(&o.NodePort, "nodeport", false, "with --services: NodePorts too, for traffic from outside the node (tcx ingress on the node's devices; the flow's conntrack entry gets the NAT, so the node's firewall still decides); externalTrafficPolicy Local uses the endpoints of --node-name (default $NODE_NAME, else the hostname)")
	f.StringSliceVar(&o.NodePortDevices, "nodeport-devices", nil, "with --nodeport: the devices NodePorts answer on (default: every device of the agent's network namespace with a global address that is not a bridge port or loopback); the node addresses are theirs")
	f.StringSliceVar(&o.HealthCheckAddrs, "nodeport-healthcheck-addresses", nil, "with --nodeport and the Kubernetes API: the addresses the healthCheckNodePorts of LoadBalancer Services with externalTrafficPolicy Local are served on, as kube-proxy serves them (default: every address; give others where kube-proxy still runs on the node)")
	// The name before the --nodeport-* scheme, still accepted.
	f.StringSliceVar(&o.HealthCheckAddrs, "healthcheck-addresses", nil, "")
	f.MarkDeprecated("healthcheck-addresses", "use --nodeport-healthcheck-addresses")
}

// Parse checks the flags Register added once f is parsed, and takes the
// values of --kubeconfig and --node-name, the Kubernetes flags the agent
// shares (registered by `eztunnel run`).
func (o *Options) Parse(f *pflag.FlagSet) error {
	if o.On {
		if o.File != "" && f.Changed("kubeconfig") {
			return fmt.Errorf("--services-file and --kubeconfig exclude each other: the services come from one source")
		}
		for flag, v := range map[string]*string{"kubeconfig": &o.Kubeconfig, "node-name": &o.NodeName} {
			fl := f.Lookup(flag)
			if fl == nil {
				return fmt.Errorf("--services: no --%s flag to read", flag)
			}
			*v = fl.Value.String()
		}
	} else if o.File != "" {
		return fmt.Errorf("--services-file needs --services")
	} else if o.NodePort || len(o.NodePortDevices) > 0 {
		return fmt.Errorf("--nodeport and --nodeport-devices need --services")
	}
	if len(o.NodePortDevices) > 0 && !o.NodePort {
		return fmt.Errorf("--nodeport-devices needs --nodeport")
	}
	if len(o.HealthCheckAddrs) > 0 && (!o.NodePort || o.File != "") {
		return fmt.Errorf("--nodeport-healthcheck-addresses needs --nodeport with the Kubernetes API (not --services-file)")
	}
	for _, a := range o.HealthCheckAddrs {
		if _, err := netip.ParseAddr(a); err != nil {
			return fmt.Errorf("--nodeport-healthcheck-addresses: %q is not an IP address", a)
		}
	}
	return nil
}

// CheckNode checks the source before anything changes (the file parses,
// the Kubernetes configuration is found); nothing is loaded.
func (o *Options) CheckNode() error {
	if !o.On {
		return nil
	}
	if o.File != "" {
		data, err := os.ReadFile(o.File)
		if err != nil {
			return fmt.Errorf("--services-file: %w", err)
		}
		if _, _, err := ParseFile(data, nodeFamilies()); err != nil {
			return fmt.Errorf("--services-file %s: %w", o.File, err)
		}
	} else if _, err := kube.RESTConfig(kube.Config{Kubeconfig: o.Kubeconfig}); err != nil {
		return fmt.Errorf("--services: %w", err)
	}
	return nil
}
