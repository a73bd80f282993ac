package kube

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
)

// apiStub answers the requests NewAPI's client makes the way an API server
// does (JSON lists, newline-delimited JSON watch events), and records them.
type apiStub struct {
	t       *testing.T
	mu      sync.Mutex
	queries map[string][]string // path (+"?watch") -> raw queries seen
	accept  []string
	lists   map[string]runtime.Object      // path -> list or object
	events  map[string][]metav1.WatchEvent // path -> events sent on its watch
}

func (s *apiStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Path
	isWatch := r.URL.Query().Get("watch") == "true"
	if isWatch {
		key += "?watch"
	}
	s.mu.Lock()
	s.queries[key] = append(s.queries[key], r.URL.RawQuery)
	s.accept = append(s.accept, r.Header.Get("Accept"))
	obj, ok := s.lists[r.URL.Path]
	events := s.events[r.URL.Path]
	s.mu.Unlock()
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: 404, Message: r.URL.Path + " not found"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if !isWatch {
		json.NewEncoder(w).Encode(obj)
		return
	}
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	for _, e := range events {
		enc.Encode(e)
	}
	w.(http.Flusher).Flush()
	<-r.Context().Done() // a watch stays open
}

func (s *apiStub) seen(key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.queries[key]...)
}

func event(typ string, obj runtime.Object) metav1.WatchEvent {
	raw, _ := json.Marshal(obj)
	return metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw}}
}

func startStub(t *testing.T, s *apiStub) API {
	t.Helper()
	s.t, s.queries = t, map[string][]string{}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	api, err := NewAPIForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return api
}

// TestRESTAPIRun runs Run through NewAPI's REST client against an HTTP stub:
// the node field selector is sent, protobuf is preferred, JSON lists and
// watch events decode.
func TestRESTAPIRun(t *testing.T) {
	tm := func(kind string) metav1.TypeMeta { return metav1.TypeMeta{APIVersion: "v1", Kind: kind} }
	p1, p2 := pod("a", "p1"), pod("a", "p2")
	p1.TypeMeta, p2.TypeMeta = tm("Pod"), tm("Pod")
	nsA := ns("a", "enabled")
	nsA.TypeMeta = tm("Namespace")
	s := &apiStub{
		lists: map[string]runtime.Object{
			"/api/v1/pods":       &corev1.PodList{TypeMeta: tm("PodList"), ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: []corev1.Pod{*p1}},
			"/api/v1/namespaces": &corev1.NamespaceList{TypeMeta: tm("NamespaceList"), ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: []corev1.Namespace{*nsA}},
		},
		events: map[string][]metav1.WatchEvent{"/api/v1/pods": {event("ADDED", p2)}},
	}
	api := startStub(t, s)
	fc := newFakeCluster(t) // for its cgroup tree
	fc.cgroupDir(p1, true)
	fc.cgroupDir(p2, true)
	rec := newRecorder()
	go runWith(t.Context(), Config{NodeName: node, Cgroup2Root: fc.root}, api, rec.apply, nil)
	deadline := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case set := <-rec.ch:
			done = names(set) == "a/p1,a/p2"
			if done && set[1].CgroupPath != filepath.Join(fc.root, "kubepods", "burstable", "pod"+string(p2.UID)) {
				t.Fatalf("p2 at %s", set[1].CgroupPath)
			}
		case <-deadline:
			t.Fatal("the watched pod never reached apply")
		}
	}
	for _, key := range []string{"/api/v1/pods", "/api/v1/pods?watch"} {
		q := s.seen(key)
		if len(q) == 0 || !strings.Contains(q[0], "fieldSelector=spec.nodeName%3Dnode-1") {
			t.Fatalf("%s queries %q: no node field selector", key, q)
		}
	}
	if q := s.seen("/api/v1/namespaces?watch"); len(q) == 0 || strings.Contains(q[0], "fieldSelector") {
		t.Fatalf("namespace watch queries %q", q)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// JSON only: kubeapi's objects have no protobuf code.
	for _, a := range s.accept {
		if a != "application/json" {
			t.Fatalf("Accept %q, want application/json", a)
		}
	}
}

// TestRESTAPIWatchRemoval: get pod, get DaemonSet, list and watch it by name.
func TestRESTAPIWatchRemoval(t *testing.T) {
	pod := agentPod(dsOwner("ez", "ds-1"))
	pod.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	ds := daemonSet("ez", "ds-1")
	ds.TypeMeta = metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"}
	ds.ResourceVersion = "5"
	dsPath := "/apis/apps/v1/namespaces/eztunnel/daemonsets"
	s := &apiStub{
		lists: map[string]runtime.Object{
			"/api/v1/namespaces/eztunnel/pods/eztunnel-abcde": pod,
			dsPath + "/ez": ds,
			dsPath: &appsv1.DaemonSetList{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSetList"},
				ListMeta: metav1.ListMeta{ResourceVersion: "5"}, Items: []appsv1.DaemonSet{*ds}},
		},
		events: map[string][]metav1.WatchEvent{dsPath: {event("DELETED", ds)}},
	}
	api := startStub(t, s)
	ch, _, err := WatchRemovalWith(t.Context(), Config{}, api, "eztunnel", "eztunnel-abcde")
	if err != nil {
		t.Fatal(err)
	}
	if !closed(ch, 10*time.Second) {
		t.Fatal("not closed after the DELETED event")
	}
	for _, key := range []string{dsPath, dsPath + "?watch"} {
		q := s.seen(key)
		if len(q) == 0 || !strings.Contains(q[0], "fieldSelector=metadata.name%3Dez") {
			t.Fatalf("%s queries %q: no name field selector", key, q)
		}
	}
	// No DaemonSet owner: an error naming the pod.
	orphan := agentPod()
	orphan.TypeMeta = pod.TypeMeta
	s.mu.Lock()
	s.lists["/api/v1/namespaces/eztunnel/pods/eztunnel-abcde"] = orphan
	s.mu.Unlock()
	if _, _, err := WatchRemovalWith(t.Context(), Config{}, api, "eztunnel", "eztunnel-abcde"); err == nil ||
		!strings.Contains(err.Error(), "eztunnel/eztunnel-abcde has no DaemonSet owner") {
		t.Fatalf("no owner: %v", err)
	}
}
