package kube

import (
	"fmt"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// fivehundred returns 10 namespaces (even ones labelled enabled) and 500 pods
// with their cgroups made in fc's tree.
func fivehundred(tb testing.TB, fc *fakeCluster) []runtime.Object {
	var objs []runtime.Object
	for n := range 10 {
		label := ""
		if n%2 == 0 {
			label = "enabled"
		}
		objs = append(objs, ns(fmt.Sprintf("ns-%d", n), label))
	}
	for i := range 500 {
		p := pod(fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("pod-%d", i))
		if i%3 == 0 {
			p.Status.QOSClass = corev1.PodQOSBestEffort
		}
		fc.cgroupDir(p, true)
		objs = append(objs, p)
	}
	return objs
}

// BenchmarkDesired500 is one reconcile pass (policy + one stat per selected
// pod + sort) over 500 pods, 250 selected.
func BenchmarkDesired500(b *testing.B) {
	fc := newFakeCluster(b)
	objs := fivehundred(b, fc)
	cfg := Config{NodeName: node, Cgroup2Root: fc.root, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r := newReconciler(cfg, fc.layout)
	r.pods, r.nss = cache.NewStore(cache.MetaNamespaceKeyFunc), cache.NewStore(cache.MetaNamespaceKeyFunc)
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Pod:
			s, _ := slimPod(asAPI(o))
			r.pods.Add(s)
		case *corev1.Namespace:
			s, _ := slimNamespace(asAPI(o))
			r.nss.Add(s)
		}
	}
	if n := len(r.desired()); n != 250 {
		b.Fatalf("%d selected, want 250", n)
	}
	b.ReportAllocs()
	for b.Loop() {
		r.desired()
	}
}

// BenchmarkRelabelToApply500 measures a namespace relabel (50 of 500 pods in
// or out) to the apply call, through the fake clientset and the informers.
func BenchmarkRelabelToApply500(b *testing.B) {
	fc := newFakeCluster(b)
	for _, o := range fivehundred(b, fc) {
		if err := fc.cs.Tracker().Add(o); err != nil {
			b.Fatal(err)
		}
	}
	rec := newRecorder()
	synced, _ := fc.run(b.Context(), Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, rec)
	fc.waitWatches("pods", "namespaces")
	<-synced
	<-rec.ch
	label := []string{"", "enabled"}
	i := 0
	var total time.Duration
	cpu0 := cpuTime()
	for b.Loop() {
		start := time.Now()
		fc.update(ns("ns-1", label[(i+1)%2]))
		set := <-rec.ch
		total += time.Since(start)
		if want := 250 + 50*((i+1)%2); len(set) != want {
			b.Fatalf("%d selected, want %d", len(set), want)
		}
		i++
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(i), "ms/relabel")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(i), "cpu-ms/relabel")
}

// cpuTime is this process's user+system CPU time (the fake API server included).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
