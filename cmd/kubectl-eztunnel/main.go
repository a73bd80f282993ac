// Command kubectl-eztunnel is eztunnel's kubectl plugin: `kubectl eztunnel
// status` runs `eztunnel status` in every agent pod of the cluster and sums
// what they report; `kubectl eztunnel connectivity` runs test pods and
// checks which pairs take the shortcut. It is installed next to kubectl
// (any directory on PATH), never in the agent's image.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/eztunnel/eztunnel/internal/cli"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-eztunnel:", err)
		var usage cli.UsageError
		if errors.As(err, &usage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	return cli.Root("kubectl-eztunnel", "eztunnel's kubectl plugin: the cluster's agents at once",
		"eztunnel's kubectl plugin (kubectl eztunnel): the cluster's agents at once.", "", statusCmd(), connectivityCmd())
}

// agents are the agent pods a command works on, and how to reach the API
// server: the flags every command takes.
type agents struct {
	kubeconfig, namespace, selector string
}

func (a *agents) register(f *pflag.FlagSet) {
	f.StringVar(&a.kubeconfig, "kubeconfig", "", "the kubeconfig (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVarP(&a.namespace, "namespace", "n", "kube-system", "the agents' namespace (the chart's release namespace)")
	f.StringVarP(&a.selector, "selector", "l", "app.kubernetes.io/name=eztunnel", "the agent pods' labels")
}

// list returns the agent pods; none is an error naming where it looked.
func (a agents) list(ctx context.Context, kc kubernetes.Interface) ([]corev1.Pod, error) {
	pods, err := kc.CoreV1().Pods(a.namespace).List(ctx, metav1.ListOptions{LabelSelector: a.selector})
	if err != nil {
		return nil, fmt.Errorf("list the agent pods (-n %s -l %s): %w", a.namespace, a.selector, err)
	}
	if len(pods.Items) == 0 {
		return nil, fmt.Errorf("no agent pods in namespace %s with labels %s: is the chart installed there?", a.namespace, a.selector)
	}
	return pods.Items, nil
}
