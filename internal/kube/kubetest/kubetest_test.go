package kubetest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/eztunnel/eztunnel/internal/kube"
)

// TestFromClientset runs kube.RunWith and kube.WatchRemovalWith on a fake clientset.
func TestFromClientset(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "kubepods", "besteffort", "poduid-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p", UID: "uid-1",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "ds-uid"}}},
		Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{QOSClass: corev1.PodQOSBestEffort}}
	cs := fake.NewSimpleClientset(p, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}})
	api := FromClientset(cs)
	got := make(chan []kube.Target, 1)
	go kube.RunWith(t.Context(), kube.Config{NodeName: "n", Default: kube.Enabled, Cgroup2Root: root}, api,
		func(s []kube.Target) error { got <- s; return nil }, nil)
	select {
	case s := <-got:
		if len(s) != 1 || s[0].UID != "uid-1" || s[0].CgroupPath != filepath.Join(root, "kubepods", "besteffort", "poduid-1") {
			t.Fatalf("apply(%+v)", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no apply")
	}
	// The DaemonSet does not exist: removed.
	ch, err := kube.WatchRemovalWith(t.Context(), kube.Config{}, api, "a", "p")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("channel open although the DaemonSet does not exist")
	}
}
