package svcsync

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// nopWriter takes every write (no maps).
type nopWriter struct{ sets int }

func (w *nopWriter) SetFrontend(lb.Frontend, lb.Target) error { w.sets++; return nil }
func (w *nopWriter) DeleteFrontend(lb.Frontend) error         { return nil }

// cacheOf is n Services in one namespace with two EndpointSlices each (the
// bench's layout), in informer-like caches.
func cacheOf(t testing.TB, n int) (cache.Indexer, cache.Indexer) {
	svcs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	sls := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc, sliceServiceIndex: sliceService})
	for i := range n {
		name := fmt.Sprintf("s%d", i)
		s := svc(name, []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)}, kubeapi.ServicePort{Name: "p", Port: 80, Protocol: kubeapi.ProtocolTCP})
		if err := svcs.Add(s); err != nil {
			t.Fatal(err)
		}
		for j, a := range []string{"10.244.0.2", "10.244.0.3"} {
			sl := slice(name, kubeapi.AddressTypeIPv4, "p", 8080, ep{addr: a, ready: ptr.To(true)})
			sl.Name = fmt.Sprintf("%s-%d", name, j)
			if err := sls.Add(sl); err != nil {
				t.Fatal(err)
			}
		}
	}
	return svcs, sls
}

// TestSlicesOf: the index finds a Service's slices only, in name order,
// and drain applies each Service with both of its slices' endpoints.
func TestSlicesOf(t *testing.T) {
	svcs, sls := cacheOf(t, 50)
	got, err := slicesOf(sls, "ns/s7")
	if err != nil || len(got) != 2 || got[0].Name != "s7-0" || got[1].Name != "s7-1" {
		t.Fatalf("slices of ns/s7: %v %v", got, err)
	}
	if got, _ := slicesOf(sls, "other/s7"); len(got) != 0 {
		t.Fatalf("slices of other/s7: %v", got)
	}
	w := &nopWriter{}
	k := &kubeSource{t: NewTable(w, nil, slog.New(slog.NewTextHandler(io.Discard, nil))), fam: both, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		svcs: svcs, slices: sls, pending: map[string]time.Time{}, wake: make(chan struct{}, 1)}
	for i := range 50 {
		k.enqueue(fmt.Sprintf("ns/s%d", i))
	}
	if n := k.drain(); n != 50 || w.sets != 50 {
		t.Fatalf("drain applied %d Services, %d frontends written; want 50, 50", n, w.sets)
	}
	if e := k.t.Frontends("ns/s7"); len(e) != 1 {
		t.Fatalf("ns/s7: %v", e)
	} else {
		for _, tg := range e {
			if len(tg.Backends) != 2 {
				t.Fatalf("ns/s7's backends: %v", tg.Backends)
			}
		}
	}
}

// BenchmarkFirstSyncSlices: finding every Service's EndpointSlices once,
// as the first sync does, with n Services in one namespace: by the
// Service index (what drain uses) and by the lister's namespace List with
// a label selector (what it used: a walk of the whole namespace per
// Service, quadratic in n).
func BenchmarkFirstSyncSlices(b *testing.B) {
	for _, n := range []int{1000, 4000, 10000} {
		_, sls := cacheOf(b, n)
		b.Run(fmt.Sprintf("index/%d", n), func(b *testing.B) {
			for b.Loop() {
				for i := range n {
					if got, _ := slicesOf(sls, fmt.Sprintf("ns/s%d", i)); len(got) != 2 {
						b.Fatal(len(got))
					}
				}
			}
		})
		if n > 4000 {
			continue // the lister takes about a minute per pass here
		}
		b.Run(fmt.Sprintf("lister/%d", n), func(b *testing.B) {
			for b.Loop() {
				for i := range n {
					sel := labels.SelectorFromSet(labels.Set{kubeapi.LabelServiceName: fmt.Sprintf("s%d", i)})
					got := 0 // what the lister's List does
					if err := cache.ListAllByNamespace(sls, "ns", sel, func(any) { got++ }); err != nil || got != 2 {
						b.Fatal(got, err)
					}
				}
			}
		})
	}
}
