package kube

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func withIPs(ips ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
	}
}

func fmtPodIPs(ps []PodIPs) string {
	s := ""
	for _, p := range ps {
		s += fmt.Sprintf("%s/%s%v;", p.Namespace, p.Name, p.IPs)
	}
	return s
}

// TestPodIPsFeed: Config.PodIPs gets the node's pod addresses (all pods,
// whatever the selection), hostNetwork, other nodes', terminal, deleting
// and address-less pods left out, again after an address changes or a pod
// goes, and not for changes that keep the addresses.
func TestPodIPsFeed(t *testing.T) {
	p1 := pod("a", "p1", withIPs("10.244.0.5", "fd00::5"))
	p2 := pod("b", "p2", withIPs("10.244.0.6")) // namespace not selected: fed anyway
	hostNet := pod("a", "hostnet", withIPs("192.0.2.1"), func(p *corev1.Pod) { p.Spec.HostNetwork = true })
	other := pod("a", "elsewhere", withIPs("10.244.1.5"), func(p *corev1.Pod) { p.Spec.NodeName = "node-2" })
	done := pod("a", "done", withIPs("10.244.0.7"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })
	pending := pod("a", "pending") // no address yet
	fc := newFakeCluster(t, ns("a", "enabled"), ns("b", ""), p1, p2, hostNet, other, done, pending)
	feed := make(chan []PodIPs, 100)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	synced, runDone := fc.run(ctx, Config{PodIPs: func(p []PodIPs) { feed <- p }}, newRecorder())
	fc.waitWatches("pods", "namespaces")
	next := func(want string) {
		t.Helper()
		select {
		case got := <-feed:
			if fmtPodIPs(got) != want {
				t.Fatalf("fed %s, want %s", fmtPodIPs(got), want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing fed; want %s", want)
		}
	}
	next("a/p1[10.244.0.5 fd00::5];b/p2[10.244.0.6];")
	<-synced

	pending.Status.PodIPs = []corev1.PodIP{{IP: "10.244.0.8"}}
	fc.update(pending)
	next("a/p1[10.244.0.5 fd00::5];a/pending[10.244.0.8];b/p2[10.244.0.6];")

	// A change that keeps the addresses feeds nothing: the next feed is the deletion.
	p2.Labels = map[string]string{"x": "y"}
	fc.update(p2)
	if err := fc.cs.CoreV1().Pods("a").Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next("a/pending[10.244.0.8];b/p2[10.244.0.6];")

	cancel()
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
}

func TestNodePodIPs(t *testing.T) {
	deleting := pod("a", "deleting", withIPs("10.0.0.9"), func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)} })
	bad := pod("a", "bad", withIPs("nonsense", "::ffff:10.0.0.3", "10.0.0.3"))
	got := NodePodIPs([]any{asAPI(deleting), asAPI(bad), "not a pod"}, node)
	if len(got) != 1 || got[0].Name != "bad" || len(got[0].IPs) != 1 || got[0].IPs[0] != netip.MustParseAddr("10.0.0.3") {
		t.Fatalf("NodePodIPs = %s", fmtPodIPs(got))
	}
}

// TestNodePodIPsBandwidth: a pod's bandwidth annotations (the bandwidth
// CNI plugin's) come with its addresses; other annotations do not.
func TestNodePodIPsBandwidth(t *testing.T) {
	shaped := pod("a", "shaped", withIPs("10.0.0.4"), func(p *corev1.Pod) {
		p.Annotations = map[string]string{"kubernetes.io/egress-bandwidth": "5M", "kubernetes.io/ingress-bandwidth": "10M", "note": "x"}
	})
	plain := pod("a", "plain", withIPs("10.0.0.5"), func(p *corev1.Pod) { p.Annotations = map[string]string{"note": "x"} })
	got := NodePodIPs([]any{asAPI(shaped), asAPI(plain)}, node)
	if len(got) != 2 || got[0].Name != "plain" || got[0].Bandwidth != "" ||
		got[1].Bandwidth != "kubernetes.io/ingress-bandwidth=10M, kubernetes.io/egress-bandwidth=5M" {
		t.Fatalf("NodePodIPs = %+v", got)
	}
}
