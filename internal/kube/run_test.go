package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

const node = "node-1"

// fakeCluster is a fake API server (client-go's fake clientset) plus a
// kubelet-shaped cgroupfs tree in a temp dir.
type fakeCluster struct {
	t       testing.TB
	cs      *fake.Clientset
	root    string // cgroup2 mount
	layout  Layout
	watches chan string // resource of each watch started
}

func newFakeCluster(t testing.TB, objs ...runtime.Object) *fakeCluster {
	t.Helper()
	root := t.TempDir()
	mkdirs(t, filepath.Join(root, "kubepods", "burstable"), filepath.Join(root, "kubepods", "besteffort"))
	cs := fake.NewSimpleClientset(objs...)
	fc := &fakeCluster{t: t, cs: cs, root: root, watches: make(chan string, 16),
		layout: Layout{PodsRoot: filepath.Join(root, "kubepods"), Driver: DriverCgroupfs}}
	// The fake tracker only sends events to watches already registered: tell
	// the test when each informer's watch is in place.
	cs.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := cs.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return false, nil, err
		}
		fc.watches <- a.GetResource().Resource
		return true, w, nil
	})
	return fc
}

func (fc *fakeCluster) waitWatches(resources ...string) {
	fc.t.Helper()
	want := map[string]bool{}
	for _, r := range resources {
		want[r] = true
	}
	deadline := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case r := <-fc.watches:
			delete(want, r)
		case <-deadline:
			fc.t.Fatalf("watches not started: %v", want)
		}
	}
}

// cgroupDir makes (or returns) a pod's directory in the tree.
func (fc *fakeCluster) cgroupDir(p *corev1.Pod, create bool) string {
	fc.t.Helper()
	dir := fc.layout.PodPaths(string(p.UID), kubeapi.PodQOSClass(p.Status.QOSClass))[0]
	if create {
		mkdirs(fc.t, filepath.Join(dir, "c0ffee"))
	}
	return dir
}

func ns(name string, label string) *corev1.Namespace {
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("ns-" + name)}}
	if label != "" {
		n.Labels = map[string]string{Key: label, "team": "x"}
	}
	return n
}

func pod(namespace, name string, mod ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(fmt.Sprintf("uid-%s-%s", namespace, name))},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBurstable},
	}
	for _, m := range mod {
		m(p)
	}
	return p
}

// recorder collects apply calls.
type recorder struct {
	mu    sync.Mutex
	calls [][]Target
	ch    chan []Target
	fail  int // fail this many calls first
}

func newRecorder() *recorder { return &recorder{ch: make(chan []Target, 100)} }

func (r *recorder) apply(set []Target) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, slices.Clone(set))
	if r.fail > 0 {
		r.fail--
		return errors.New("map full (test)")
	}
	r.ch <- slices.Clone(set)
	return nil
}

func names(set []Target) string {
	var s []string
	for _, t := range set {
		s = append(s, t.Namespace+"/"+t.Name)
	}
	return strings.Join(s, ",")
}

// next waits for the next successful apply and checks its set.
func (fc *fakeCluster) next(rec *recorder, want string) []Target {
	fc.t.Helper()
	select {
	case set := <-rec.ch:
		if got := names(set); got != want {
			fc.t.Fatalf("apply(%s), want apply(%s)", got, want)
		}
		for _, tg := range set {
			if id := inode(fc.t, tg.CgroupPath); id != tg.CgroupID {
				fc.t.Fatalf("%s/%s: cgroup id %d, inode of %s is %d", tg.Namespace, tg.Name, tg.CgroupID, tg.CgroupPath, id)
			}
		}
		return set
	case <-time.After(10 * time.Second):
		fc.t.Fatalf("no apply; want apply(%s)", want)
		return nil
	}
}

func (fc *fakeCluster) update(o any) {
	fc.t.Helper()
	ctx := context.Background()
	var err error
	switch o := o.(type) {
	case *corev1.Pod:
		_, err = fc.cs.CoreV1().Pods(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
	case *corev1.Namespace:
		_, err = fc.cs.CoreV1().Namespaces().Update(ctx, o, metav1.UpdateOptions{})
	}
	if err != nil {
		fc.t.Fatal(err)
	}
}

func (fc *fakeCluster) run(ctx context.Context, cfg Config, rec *recorder) (synced chan struct{}, done chan error) {
	cfg.NodeName, cfg.Cgroup2Root = node, fc.root
	synced, done = make(chan struct{}), make(chan error, 1)
	var once sync.Once
	go func() {
		done <- runWith(ctx, cfg, fromClientset(fc.cs), rec.apply, func() {
			once.Do(func() { close(synced) }) // a second call would panic the test
		})
	}()
	return synced, done
}

// TestRunConverges drives Run through pods added, relabelled (namespace label
// and pod annotation), deleted, and a cgroup appearing late.
func TestRunConverges(t *testing.T) {
	var logs syncBuffer
	asks := func(p *corev1.Pod) { p.Annotations = map[string]string{Key: "enabled"} }
	selfPod := pod("a", "agent", func(p *corev1.Pod) { p.Spec.HostNetwork = true })
	p1 := pod("a", "p1")
	p2 := pod("b", "p2", func(p *corev1.Pod) { p.Status.QOSClass = corev1.PodQOSBestEffort })
	hostNet := pod("a", "hostnet", func(p *corev1.Pod) { p.Spec.HostNetwork = true })
	otherNode := pod("a", "elsewhere", func(p *corev1.Pod) { p.Spec.NodeName = "node-2" })
	done := pod("a", "done", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })
	late := pod("a", "late", func(p *corev1.Pod) { p.Status.QOSClass = "" }) // QoS not reported yet
	guaranteed := pod("c", "g", func(p *corev1.Pod) { p.Status.QOSClass = corev1.PodQOSGuaranteed })
	// The tenant: a pod that annotates itself enabled in a namespace the
	// operator labelled disabled, and one in an unlabelled namespace.
	tenant := pod("d", "tenant", asks)
	unlabelled := pod("b", "asks", asks)
	fc := newFakeCluster(t, ns("a", "enabled"), ns("b", ""), ns("c", "bogus"), ns("d", "disabled"),
		selfPod, p1, p2, hostNet, otherNode, done, late, guaranteed, tenant, unlabelled)
	for _, p := range []*corev1.Pod{selfPod, p1, p2, hostNet, otherNode, done, guaranteed, tenant, unlabelled} {
		fc.cgroupDir(p, true)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rec := newRecorder()
	synced, runDone := fc.run(ctx, Config{SelfUID: string(selfPod.UID), Logger: slog.New(slog.NewTextHandler(&logs, nil))}, rec)
	fc.waitWatches("pods", "namespaces")

	// Labelled namespace a: p1 only (hostnet, agent, other node, terminal and
	// cgroup-less pods are out); b unlabelled, c invalid: default disabled; d
	// disabled, its pod's annotation notwithstanding; b's annotated pod is
	// not allowed to opt in.
	fc.next(rec, "a/p1")
	<-synced

	// The kubelet makes the late pod's cgroup (burstable, QoS still empty).
	mkdirs(t, filepath.Join(fc.root, "kubepods", "burstable", "pod"+string(late.UID)))
	fc.next(rec, "a/late,a/p1")

	// Namespace b labelled enabled.
	fc.update(ns("b", "enabled"))
	fc.next(rec, "a/late,a/p1,b/asks,b/p2")

	// A pod annotation opts out of the namespace label.
	p1.Annotations = map[string]string{Key: "disabled"}
	fc.update(p1)
	fc.next(rec, "a/late,b/asks,b/p2")

	// Host-network pod and the agent itself, asked for by annotation: never.
	// The Guaranteed pod in the invalidly labelled namespace c by annotation:
	// ignored until c allows its pods to opt in.
	hostNet.Annotations = map[string]string{Key: "enabled"}
	selfPod.Annotations = map[string]string{Key: "enabled"}
	guaranteed.Annotations = map[string]string{Key: "enabled"}
	fc.update(hostNet)
	fc.update(selfPod)
	fc.update(guaranteed)
	nsC := ns("c", "bogus")
	nsC.Labels[OptInKey] = "enabled"
	fc.update(nsC)
	set := fc.next(rec, "a/late,b/asks,b/p2,c/g")
	if set[3].CgroupPath != filepath.Join(fc.root, "kubepods", "pod"+string(guaranteed.UID)) {
		t.Fatalf("guaranteed pod at %s", set[3].CgroupPath)
	}
	// Namespace d allows opt-in too: still disabled, the tenant stays out.
	nsD := ns("d", "disabled")
	nsD.Labels[OptInKey] = "enabled"
	fc.update(nsD)

	// A change that selects nothing new gives no apply: the next apply seen is
	// the deletion below.
	p2.Labels = map[string]string{"app": "x"}
	fc.update(p2)
	fc.update(ns("a", "enabled"))

	// Pod deleted.
	if err := fc.cs.CoreV1().Pods("b").Delete(ctx, "p2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fc.next(rec, "a/late,b/asks,c/g")

	// Pod being deleted: selected while its cgroup is there, dropped once the
	// kubelet removed it (no API event needed).
	now := metav1.Now()
	late.DeletionTimestamp = &now
	fc.update(late)
	p1.Annotations = nil // the next apply shows late still selected
	fc.update(p1)
	fc.next(rec, "a/late,a/p1,b/asks,c/g")
	lateDir := filepath.Join(fc.root, "kubepods", "burstable", "pod"+string(late.UID))
	if err := os.RemoveAll(lateDir); err != nil {
		t.Fatal(err)
	}
	fc.next(rec, "a/p1,b/asks,c/g")

	// Pod turned terminal.
	p1.Status.Phase = corev1.PodFailed
	fc.update(p1)
	fc.next(rec, "b/asks,c/g")

	cancel()
	if err := <-runDone; err != nil {
		t.Fatalf("Run returned %v", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i := 1; i < len(rec.calls); i++ {
		if names(rec.calls[i]) == names(rec.calls[i-1]) {
			t.Errorf("apply %d repeated an unchanged set %s", i, names(rec.calls[i]))
		}
	}
	if n := strings.Count(logs.String(), `object="namespace c"`); n != 1 {
		t.Errorf("invalid namespace label logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestRunApplyRetries: a failing apply is retried (with the current set) and
// synced waits for the first success.
func TestRunApplyRetries(t *testing.T) {
	p1 := pod("a", "p1")
	fc := newFakeCluster(t, ns("a", ""), p1)
	fc.cgroupDir(p1, true)
	rec := newRecorder()
	rec.fail = 3
	var logs syncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	synced, _ := fc.run(ctx, Config{Default: Enabled, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, rec)
	fc.next(rec, "a/p1")
	<-synced
	rec.mu.Lock()
	n := len(rec.calls)
	rec.mu.Unlock()
	if n != 4 {
		t.Fatalf("%d apply calls, want 3 failed + 1", n)
	}
	if c := strings.Count(logs.String(), "map full (test)"); c != 3 {
		t.Fatalf("%d errors logged, want 3:\n%s", c, logs.String())
	}
}

// TestRunEmptyFirstApply: with nothing selected the first apply still
// happens (empty), so the caller can drop stale state, and synced follows.
func TestRunEmptyFirstApply(t *testing.T) {
	fc := newFakeCluster(t, ns("a", ""), pod("a", "p1"))
	rec := newRecorder()
	synced, _ := fc.run(t.Context(), Config{}, rec)
	fc.next(rec, "")
	<-synced
}

// syncBuffer is a bytes.Buffer safe for the logger and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunSelect: with Config.Select the selection policy is not used (the
// shortcut annotation and namespace label mean nothing) and each target
// carries its ServicesKey annotation, updated when it changes.
func TestRunSelect(t *testing.T) {
	ann := func(k, v string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[k] = v
		}
	}
	p1 := pod("a", "p1", ann(ServicesKey, "proxy:1337"), ann(Key, "disabled"))
	p2 := pod("a", "p2", ann(Key, "enabled"))
	fc := newFakeCluster(t, ns("a", "enabled"), p1, p2)
	fc.cgroupDir(p1, true)
	fc.cgroupDir(p2, true)
	rec := newRecorder()
	fc.run(t.Context(), Config{Select: func(p *kubeapi.Pod) bool {
		_, ok := p.Annotations[ServicesKey]
		return ok
	}}, rec)
	if set := fc.next(rec, "a/p1"); set[0].Services != "proxy:1337" {
		t.Fatalf("p1: Services %q", set[0].Services)
	}
	fc.waitWatches("pods", "namespaces")
	p1.Annotations[ServicesKey] = "socket"
	fc.update(p1)
	if set := fc.next(rec, "a/p1"); set[0].Services != "socket" {
		t.Fatalf("p1 changed: Services %q", set[0].Services)
	}
	delete(p1.Annotations, ServicesKey)
	fc.update(p1)
	fc.next(rec, "")
}

// TestPodWatchShared: two consumers of one PodWatch (the shortcut's policy
// and the Service load balancer's Select) each get their own selection from
// one list and one watch of pods and of namespaces; a consumer added after
// the first sync starts at once; a consumer whose context ends stops alone.
func TestPodWatchShared(t *testing.T) {
	p1 := pod("a", "p1", func(p *corev1.Pod) { p.Annotations = map[string]string{ServicesKey: "proxy"} })
	p2 := pod("b", "p2")
	nsB := ns("b", "")
	nsB.Labels = map[string]string{OptInKey: "enabled"} // p2 may opt in
	fc := newFakeCluster(t, ns("a", "enabled"), nsB, p1, p2)
	fc.cgroupDir(p1, true)
	fc.cgroupDir(p2, true)
	cfg := Config{NodeName: node, Cgroup2Root: fc.root}
	w, err := NewPodWatchWith(cfg, fromClientset(fc.cs))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	policyRec, selectRec, lateRec := newRecorder(), newRecorder(), newRecorder()
	w.Add(ctx, cfg, policyRec.apply, nil)
	selCtx, stopSel := context.WithCancel(ctx)
	w.Add(selCtx, Config{Select: func(p *kubeapi.Pod) bool { _, ok := p.Annotations[ServicesKey]; return ok }}, selectRec.apply, nil)
	go w.Run(ctx)
	fc.next(policyRec, "a/p1")
	fc.next(selectRec, "a/p1")
	fc.waitWatches("pods", "namespaces")

	w.Add(ctx, Config{Select: func(p *kubeapi.Pod) bool { return p.Namespace == "b" }}, lateRec.apply, nil)
	fc.next(lateRec, "b/p2")

	stopSel()
	time.Sleep(2 * Debounce) // the stopped consumer's loop ends
	p2.Annotations = map[string]string{ServicesKey: "proxy", Key: "enabled"}
	fc.update(p2)
	fc.next(policyRec, "a/p1,b/p2")
	fc.next(lateRec, "b/p2") // applied again: the target carries the annotation
	select {
	case set := <-selectRec.ch:
		t.Fatalf("a stopped consumer applied %s", names(set))
	case <-time.After(3 * Debounce):
	}

	lists, watches := map[string]int{}, map[string]int{}
	for _, a := range fc.cs.Actions() {
		switch a.GetVerb() {
		case "list":
			lists[a.GetResource().Resource]++
		case "watch":
			watches[a.GetResource().Resource]++
		}
	}
	for _, r := range []string{"pods", "namespaces"} {
		if lists[r] != 1 || watches[r] != 1 {
			t.Errorf("%s: %d lists and %d watches for three consumers, want 1 and 1", r, lists[r], watches[r])
		}
	}
	if err := w.Run(ctx); err == nil {
		t.Error("a second Run was accepted")
	}
}

// runWith is Run on a given API (client-go's fake clientset, fakeapi_test.go).
func runWith(ctx context.Context, cfg Config, api API, apply func([]Target) error, synced func()) error {
	w, err := NewPodWatchWith(cfg, api)
	if err != nil {
		return err
	}
	w.Add(ctx, cfg, apply, synced)
	return w.Run(ctx)
}
