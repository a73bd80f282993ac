package kube

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// Timings of the reconciliation loop.
const (
	Debounce     = 100 * time.Millisecond // events to apply, at most
	PollInterval = 200 * time.Millisecond // pods waiting for their cgroup, pods being deleted
	retryMin     = 200 * time.Millisecond // apply errors: doubling backoff
	retryMax     = 5 * time.Second
)

// Run watches the node's pods and all namespaces and calls apply with the
// full desired set (sorted by namespace/name) whenever it changes, at most
// Debounce after the event. The first apply always happens (possibly with an
// empty set) once the caches synced; synced is then called once after that
// apply succeeded. A failed apply is logged and retried with backoff. Pods
// whose cgroup does not exist yet are retried every PollInterval. Run
// returns nil when ctx ends. It is a PodWatch with one consumer.
func Run(ctx context.Context, cfg Config, apply func([]Target) error, synced func()) error {
	w, err := NewPodWatch(cfg)
	if err != nil {
		return err
	}
	w.Add(ctx, cfg, apply, synced)
	return w.Run(ctx)
}

// PodWatch is the one watch of a node's pods and of all namespaces: one
// list and one watch of each, whatever the number of consumers (the
// shortcut's pod selection, the Service load balancer's pods left to their
// proxy, the bridge bypass's pod addresses). Each consumer has its own
// selection, apply loop, debounce and backoff on the shared caches.
type PodWatch struct {
	cfg    Config // the shared fields: Kubeconfig, NodeName, the cgroup layout
	layout Layout
	pods   cache.Store
	nss    cache.Store
	podCtl cache.Controller
	nsCtl  cache.Controller

	synced  chan struct{} // closed once both caches synced
	stopped chan struct{} // closed when Run returns

	mu      sync.Mutex
	users   map[*reconciler]struct{}
	started bool

	health healthLog
}

// NewPodWatch connects with RESTConfig(cfg) and finds the pods' cgroups;
// nothing is listed before Run.
func NewPodWatch(cfg Config) (*PodWatch, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err // before the API's configuration: a bad flag first
	}
	api, err := NewAPI(cfg)
	if err != nil {
		return nil, err
	}
	return NewPodWatchWith(cfg, api)
}

// NewPodWatchWith is NewPodWatch on a given API.
func NewPodWatchWith(cfg Config, api API) (*PodWatch, error) {
	layout, err := DetectLayout(cfg) // validates cfg
	if err != nil {
		return nil, err
	}
	w := &PodWatch{cfg: cfg, layout: layout, users: map[*reconciler]struct{}{}, synced: make(chan struct{}), stopped: make(chan struct{})}
	nodeSel := fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	w.pods, w.podCtl = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.FieldSelector = nodeSel
				l, err := api.ListPods(ctx, o)
				return l, w.health.call(err)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.FieldSelector = nodeSel
				wi, err := api.WatchPods(ctx, o)
				return wi, w.health.call(err)
			},
		},
		ObjectType: &kubeapi.Pod{},
		Handler:    w.handler("pod "),
		Transform:  slimPod,
	})
	w.nss, w.nsCtl = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				l, err := api.ListNamespaces(ctx, o)
				return l, w.health.call(err)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				wi, err := api.WatchNamespaces(ctx, o)
				return wi, w.health.call(err)
			},
		},
		ObjectType: &kubeapi.Namespace{},
		Handler:    w.handler("namespace "),
		Transform:  slimNamespace,
	})
	return w, nil
}

// Health is the watch's state now.
func (w *PodWatch) Health() Health { return w.health.get() }

// Layout is where the watch finds the pods' cgroups.
func (w *PodWatch) Layout() Layout { return w.layout }

// Add starts a consumer: apply and synced as Run's, with cfg's selection
// (Select, or the policy of Default and SelfUID), PodIPs and Logger; the
// watch's own fields (node, cgroup layout) are the PodWatch's. The consumer
// starts once the caches synced (at once if they have) and stops when ctx
// or the watch ends. Consumers may be added before or after Run.
func (w *PodWatch) Add(ctx context.Context, cfg Config, apply func([]Target) error, synced func()) {
	cfg.Kubeconfig, cfg.NodeName = w.cfg.Kubeconfig, w.cfg.NodeName
	cfg.Cgroup2Root, cfg.PodsCgroup, cfg.Driver = w.cfg.Cgroup2Root, w.cfg.PodsCgroup, w.cfg.Driver
	r := newReconciler(cfg, w.layout)
	r.pods, r.nss = w.pods, w.nss
	if cfg.Select != nil {
		r.log.Info("kubernetes: watching pods (selected by the caller)", "node", cfg.NodeName, "pods_cgroup", w.layout.PodsRoot, "driver", w.layout.Driver)
	} else {
		r.log.Info("kubernetes: watching pods", "node", cfg.NodeName, "pods_cgroup", w.layout.PodsRoot,
			"driver", w.layout.Driver, "default_policy", cfg.defaultPolicy())
	}
	w.mu.Lock()
	w.users[r] = struct{}{}
	w.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer func() {
			w.mu.Lock()
			delete(w.users, r)
			w.mu.Unlock()
		}()
		select {
		case <-ctx.Done():
			return
		case <-w.stopped:
			return
		case <-w.synced:
		}
		go func() { // the watch's end ends the consumer
			select {
			case <-w.stopped:
				cancel()
			case <-ctx.Done():
			}
		}()
		r.loop(ctx, apply, synced)
		cancel()
	}()
}

// Run lists and watches until ctx ends, then returns nil; consumers stop
// with it. It runs once.
func (w *PodWatch) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return errors.New("kubernetes: the pod watch runs once")
	}
	w.started = true
	w.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		close(w.stopped)
	}()
	go w.podCtl.RunWithContext(ctx)
	go w.nsCtl.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), w.podCtl.HasSynced, w.nsCtl.HasSynced) {
		return nil // ctx ended
	}
	w.health.synced()
	close(w.synced)
	<-ctx.Done()
	return nil
}

// handler wakes every consumer; a deleted object's warnings are forgotten.
func (w *PodWatch) handler(kind string) cache.ResourceEventHandler {
	each := func(f func(*reconciler)) {
		w.health.event()
		w.mu.Lock()
		defer w.mu.Unlock()
		for r := range w.users {
			f(r)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { each((*reconciler).wake) },
		UpdateFunc: func(any, any) { each((*reconciler).wake) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			name := ""
			if m, ok := obj.(metav1.Object); ok {
				name = m.GetName()
				if m.GetNamespace() != "" {
					name = m.GetNamespace() + "/" + name
				}
			}
			each(func(r *reconciler) {
				if name != "" {
					r.pol.forget(kind + name)
				}
				r.wake()
			})
		},
	}
}

// slimPod keeps only what selection and cgroup mapping read.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*kubeapi.Pod)
	if !ok {
		return obj, nil
	}
	out := &kubeapi.Pod{}
	out.Name, out.Namespace, out.UID = p.Name, p.Namespace, p.UID
	out.ResourceVersion = p.ResourceVersion
	out.DeletionTimestamp = p.DeletionTimestamp
	for _, k := range []string{Key, ServicesKey} {
		if v, ok := p.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	out.Spec.NodeName, out.Spec.HostNetwork = p.Spec.NodeName, p.Spec.HostNetwork
	out.Status.Phase, out.Status.QOSClass = p.Status.Phase, p.Status.QOSClass
	out.Status.PodIPs = p.Status.PodIPs // podips.go
	return out, nil
}

func slimNamespace(obj any) (any, error) {
	n, ok := obj.(*kubeapi.Namespace)
	if !ok {
		return obj, nil
	}
	out := &kubeapi.Namespace{}
	out.Name, out.UID, out.ResourceVersion = n.Name, n.UID, n.ResourceVersion
	for _, k := range []string{Key, OptInKey} {
		if v, ok := n.Labels[k]; ok {
			if out.Labels == nil {
				out.Labels = map[string]string{}
			}
			out.Labels[k] = v
		}
	}
	return out, nil
}

type resolved struct {
	path string
	id   uint64
}

type reconciler struct {
	cfg    Config
	layout Layout
	log    *slog.Logger
	pol    *policy
	pods   cache.Store
	nss    cache.Store
	kick   chan struct{}

	cgroups map[string]resolved // pod UID -> its cgroup, as last found
	podIPs  []PodIPs            // last fed to cfg.PodIPs (podips.go)
	errLog  map[string]string   // pod UID -> last cgroup error logged
	poll    bool                // some selected pod waits for its cgroup or is being deleted
}

func newReconciler(cfg Config, layout Layout) *reconciler {
	return &reconciler{
		cfg: cfg, layout: layout, log: cfg.logger(), pol: newPolicy(cfg),
		kick:    make(chan struct{}, 1),
		cgroups: map[string]resolved{},
		errLog:  map[string]string{},
	}
}

func (r *reconciler) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// loop runs after the caches synced: apply at once, then debounce events,
// poll while pods wait for their cgroups, and back off after apply errors.
func (r *reconciler) loop(ctx context.Context, apply func([]Target) error, synced func()) {
	var (
		last     []Target
		applied  bool
		retry    time.Duration
		debounce <-chan time.Time // armed by the first event, not pushed back by later ones
		backoff  <-chan time.Time // armed while apply fails
		poll     <-chan time.Time // armed while pods wait (r.poll): an idle agent does not wake
	)
	arm := func() {
		poll = nil
		if r.poll {
			poll = time.After(PollInterval)
		}
	}

	reconcile := func() {
		r.feedPodIPs() // podips.go
		set := r.desired()
		if applied && slices.Equal(set, last) {
			return
		}
		if err := apply(set); err != nil {
			if retry == 0 {
				retry = retryMin
			} else {
				retry = min(2*retry, retryMax)
			}
			r.log.Error("kubernetes: applying the selected pods failed, retrying", "pods", len(set), "retry_in", retry, "err", err)
			backoff = time.After(retry)
			return
		}
		if retry != 0 {
			r.log.Info("kubernetes: applying the selected pods succeeded after retries", "pods", len(set))
		}
		retry, backoff = 0, nil
		first := !applied
		last, applied = set, true
		if first {
			r.log.Info("kubernetes: pods synced", "selected", len(set))
			if synced != nil {
				synced()
			}
		}
	}

	reconcile()
	arm()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
			if debounce == nil {
				debounce = time.After(Debounce)
			}
		case <-debounce:
			debounce = nil
			if backoff == nil {
				reconcile()
				arm()
			}
		case <-backoff:
			backoff = nil
			reconcile()
			arm()
		case <-poll:
			if backoff == nil && debounce == nil {
				reconcile()
			}
			arm()
		}
	}
}

// desired computes the selected pods whose cgroups exist now.
func (r *reconciler) desired() []Target {
	var set []Target
	seen := make(map[string]struct{}, len(r.cgroups))
	r.poll = false
	for _, obj := range r.pods.List() {
		p := obj.(*kubeapi.Pod)
		// The API server filters by node; fake clients do not.
		if p.Spec.NodeName != r.cfg.NodeName || p.Status.Phase == kubeapi.PodSucceeded || p.Status.Phase == kubeapi.PodFailed {
			continue
		}
		if r.cfg.Select != nil {
			if !r.cfg.Select(p) {
				continue
			}
		} else {
			var ns *kubeapi.Namespace
			if o, ok, _ := r.nss.GetByKey(p.Namespace); ok {
				ns = o.(*kubeapi.Namespace)
			}
			if !r.pol.decide(p, ns).Selected {
				continue
			}
		}
		uid := string(p.UID)
		seen[uid] = struct{}{}
		if p.DeletionTimestamp != nil {
			r.poll = true // selected until its cgroup is gone
		}
		cg, ok := r.cgroup(p)
		if !ok {
			r.poll = true
			continue
		}
		set = append(set, Target{Namespace: p.Namespace, Name: p.Name, UID: uid, CgroupID: cg.id, CgroupPath: cg.path, Services: p.Annotations[ServicesKey]})
	}
	for uid := range r.cgroups {
		if _, ok := seen[uid]; !ok {
			delete(r.cgroups, uid)
		}
	}
	for uid := range r.errLog {
		if _, ok := seen[uid]; !ok {
			delete(r.errLog, uid)
		}
	}
	slices.SortFunc(set, func(a, b Target) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return set
}

// cgroup finds a pod's cgroup: the known path if it still exists (same
// inode check as the BPF side: the ID is the inode), else the candidates.
func (r *reconciler) cgroup(p *kubeapi.Pod) (resolved, bool) {
	uid := string(p.UID)
	if cg, ok := r.cgroups[uid]; ok {
		if id, err := cgroupv2.ID(cg.path); err == nil {
			return resolved{cg.path, id}, true
		}
		delete(r.cgroups, uid)
	}
	path, id, ok, err := r.layout.Resolve(uid, p.Status.QOSClass)
	if err != nil && r.errLog[uid] != err.Error() {
		r.errLog[uid] = err.Error()
		r.log.Warn("kubernetes: pod cgroup unreadable", "pod", p.Namespace+"/"+p.Name, "err", err)
	}
	if !ok {
		return resolved{}, false
	}
	cg := resolved{path, id}
	r.cgroups[uid] = cg
	return cg, true
}
