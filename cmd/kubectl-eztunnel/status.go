package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/eztunnel/eztunnel/internal/agentapi"
	"github.com/eztunnel/eztunnel/internal/cli"
)

// clusterStatus is `kubectl eztunnel status -o json`.
type clusterStatus struct {
	Nodes  []nodeStatus `json:"nodes"`
	Totals totals       `json:"totals"`
}

// nodeStatus is one agent pod's `eztunnel status`, or why it has none.
type nodeStatus struct {
	Node   string               `json:"node"`
	Pod    string               `json:"pod"`
	Status *agentapi.NodeStatus `json:"status,omitempty"`
	Error  string               `json:"error,omitempty"`
}

// totals sums the nodes.
type totals struct {
	Nodes        int               `json:"nodes"`         // agent pods found
	Answered     int               `json:"answered"`      // pods whose `eztunnel status` answered
	AgentsUp     int               `json:"agents_up"`     // of them, with an agent holding the datapath
	WatchHealthy int               `json:"watch_healthy"` // of them, with a healthy pod watch
	PodsSelected int               `json:"pods_selected"`
	Counters     map[string]uint64 `json:"counters"`
}

type statusOptions struct {
	agents
	container, output string
	timeout           time.Duration
}

func statusCmd() *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Run `eztunnel status` in every agent pod and sum what they report",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.CheckOutput(o.output); err != nil {
				return err
			}
			cs, err := o.collect(cmd.Context())
			if err != nil {
				return err
			}
			if err := cli.Render(o.output, cs, func() { printCluster(cmd.OutOrStdout(), cs) }); err != nil {
				return err
			}
			if cs.Totals.Answered < cs.Totals.Nodes {
				return fmt.Errorf("%d of %d agent pods did not answer", cs.Totals.Nodes-cs.Totals.Answered, cs.Totals.Nodes)
			}
			return nil
		},
	}
	f := cmd.Flags()
	o.agents.register(f)
	f.StringVarP(&o.container, "container", "c", "agent", "the agent's container")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long each pod may take to answer")
	cli.OutputFlag(cmd, &o.output)
	return cmd
}

// collect asks every agent pod, a few at once.
func (o statusOptions) collect(ctx context.Context) (clusterStatus, error) {
	rc, kc, err := clients(o.kubeconfig)
	if err != nil {
		return clusterStatus{}, err
	}
	pods, err := o.list(ctx, kc)
	if err != nil {
		return clusterStatus{}, err
	}
	out := make([]nodeStatus, len(pods))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i] = o.ask(ctx, rc, kc, p)
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b nodeStatus) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Pod, b.Pod))
	})
	return clusterStatus{Nodes: out, Totals: sum(out)}, nil
}

// clients connects as kubectl does: --kubeconfig, else $KUBECONFIG, else
// ~/.kube/config.
func clients(kubeconfig string) (*rest.Config, kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	return rc, kc, nil
}

// ask runs `eztunnel status -o json` in pod p.
func (o statusOptions) ask(ctx context.Context, rc *rest.Config, kc kubernetes.Interface, p corev1.Pod) nodeStatus {
	ns := nodeStatus{Node: p.Spec.NodeName, Pod: p.Name}
	if p.Status.Phase != corev1.PodRunning {
		ns.Error = "pod " + string(p.Status.Phase)
		return ns
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	stdout, err := execIn(ctx, rc, kc, p.Namespace, p.Name, o.container, []string{"/eztunnel", "status", "-o", "json"})
	if err != nil {
		ns.Error = err.Error()
		return ns
	}
	var st agentapi.NodeStatus
	if err := json.Unmarshal(stdout, &st); err != nil {
		ns.Error = fmt.Sprintf("decode its status: %v", err)
		return ns
	}
	ns.Status = &st
	return ns
}

// execIn runs cmd in a pod's container as `kubectl exec` does (WebSocket,
// falling back to SPDY for older API servers) and returns its stdout.
func execIn(ctx context.Context, rc *rest.Config, kc kubernetes.Interface, ns, pod, container string, cmd []string) ([]byte, error) {
	req := kc.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(rc, "GET", req.URL().String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(rc, "POST", req.URL())
	if err != nil {
		return nil, err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, httpstream.IsUpgradeFailure)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return nil, fmt.Errorf("exec %s in %s/%s: %w: %s", strings.Join(cmd, " "), ns, pod, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func sum(nodes []nodeStatus) totals {
	t := totals{Nodes: len(nodes), Counters: map[string]uint64{}}
	for _, n := range nodes {
		st := n.Status
		if st == nil {
			continue
		}
		t.Answered++
		if st.Agent != nil {
			t.AgentsUp++
		}
		if v := st.AgentView; v != nil && v.Kubernetes != nil {
			t.PodsSelected += len(v.Kubernetes.Selected)
			if v.Kubernetes.Watch.Healthy() {
				t.WatchHealthy++
			}
		}
		for k, v := range st.Counters {
			t.Counters[k] += v
		}
	}
	return t
}

func printCluster(out io.Writer, cs clusterStatus) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tPOD\tAGENT\tVERSION\tPOD WATCH\tPODS SELECTED\tPAIRS\tPARTS OFF")
	for _, n := range cs.Nodes {
		st := n.Status
		if st == nil {
			fmt.Fprintf(w, "%s\t%s\tunknown: %s\t\t\t\t\t\n", n.Node, n.Pod, n.Error)
			continue
		}
		agent, version, watch, selected := "none", "", "-", "-"
		if st.Agent != nil {
			agent, version = "running", st.Agent.Version
		}
		if v := st.AgentView; v != nil && v.Kubernetes != nil {
			watch = "healthy"
			if !v.Kubernetes.Watch.Healthy() {
				watch = cmp.Or(v.Kubernetes.Watch.LastError, "not listed yet")
			}
			selected = fmt.Sprint(len(v.Kubernetes.Selected))
		}
		var off []string
		if st.Parts != nil {
			for _, p := range st.Parts.Sorted() {
				if !p.Runs {
					off = append(off, string(p.Part))
				}
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", n.Node, n.Pod, agent, version, watch, selected, st.Counters["pairs"], cmp.Or(strings.Join(off, ","), "-"))
	}
	t := cs.Totals
	fmt.Fprintf(w, "TOTAL\t%d pods, %d answered\t%d running\t\t%d healthy\t%d\t%d\t\n", t.Nodes, t.Answered, t.AgentsUp, t.WatchHealthy, t.PodsSelected, t.Counters["pairs"])
	w.Flush()
	var names []string
	for _, k := range slices.Sorted(maps.Keys(t.Counters)) {
		if t.Counters[k] > 0 {
			names = append(names, fmt.Sprintf("%s=%d", k, t.Counters[k]))
		}
	}
	fmt.Fprintf(out, "counters summed over the nodes: %s\n", cmp.Or(strings.Join(names, " "), "all zero"))
}
