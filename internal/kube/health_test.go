package kube

import (
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// TestPodWatchHealth: a pod list the API refuses is counted and named,
// the watch is not healthy until it has listed and the API answered since;
// events are timed.
func TestPodWatchHealth(t *testing.T) {
	p1 := pod("a", "p1")
	fc := newFakeCluster(t, ns("a", "enabled"), p1)
	fc.cgroupDir(p1, true)
	refused := 0
	fc.cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refused < 2 {
			refused++
			return true, nil, errors.New("etcdserver: request timed out")
		}
		return false, nil, nil
	})
	cfg := Config{NodeName: node, Cgroup2Root: fc.root}
	w, err := NewPodWatchWith(cfg, fromClientset(fc.cs))
	if err != nil {
		t.Fatal(err)
	}
	if h := w.Health(); h.Synced || h.Healthy() {
		t.Fatalf("before Run: %+v", h)
	}
	rec := newRecorder()
	w.Add(t.Context(), cfg, rec.apply, nil)
	go w.Run(t.Context())
	fc.next(rec, "a/p1") // listed after the two refusals (the reflector's backoff)
	deadline := time.Now().Add(10 * time.Second)
	for !w.Health().Synced && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	h := w.Health()
	if !h.Healthy() || h.Errors != 2 || h.LastError != "etcdserver: request timed out" || h.LastEvent.IsZero() || !h.LastOK.After(h.LastErrorAt) {
		t.Fatalf("after two refused lists and one answered: %+v (healthy %v)", h, h.Healthy())
	}
	var l healthLog
	l.synced()
	l.call(nil)
	l.call(errors.New("watch refused"))
	if l.get().Healthy() {
		t.Fatalf("a failure after the last answer is not healthy: %+v", l.get())
	}
}
