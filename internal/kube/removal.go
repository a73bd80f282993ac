package kube

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// WatchRemoval returns a channel closed when the DaemonSet owning the pod
// podNamespace/podName is deleted or marked for deletion (helm uninstall),
// but not when it is updated (a rolling update). The channel stays open when
// ctx ends. It needs get on the pod and get/list/watch on that DaemonSet.
func WatchRemoval(ctx context.Context, cfg Config, podNamespace, podName string) (<-chan struct{}, error) {
	api, err := NewAPI(cfg)
	if err != nil {
		return nil, err
	}
	return WatchRemovalWith(ctx, cfg, api, podNamespace, podName)
}

// DaemonSetOwner returns the DaemonSet that owns a pod (name and UID).
func DaemonSetOwner(ctx context.Context, api API, podNamespace, podName string) (string, types.UID, error) {
	if podNamespace == "" || podName == "" {
		return "", "", fmt.Errorf("kubernetes: agent pod namespace/name %q/%q: both needed (set $POD_NAMESPACE and $POD_NAME)", podNamespace, podName)
	}
	pod, err := api.GetPod(ctx, podNamespace, podName)
	if err != nil {
		return "", "", fmt.Errorf("kubernetes: get agent pod %s/%s: %w", podNamespace, podName, err)
	}
	for _, o := range pod.OwnerReferences {
		if o.Kind == "DaemonSet" && (o.APIVersion == "apps/v1" || o.APIVersion == "") {
			return o.Name, o.UID, nil
		}
	}
	return "", "", fmt.Errorf("kubernetes: agent pod %s/%s has no DaemonSet owner", podNamespace, podName)
}

// WatchRemovalWith is WatchRemoval on a given API.
func WatchRemovalWith(ctx context.Context, cfg Config, api API, podNamespace, podName string) (<-chan struct{}, error) {
	name, uid, err := DaemonSetOwner(ctx, api, podNamespace, podName)
	if err != nil {
		return nil, err
	}
	log := cfg.logger()
	dsName := podNamespace + "/" + name
	removed := make(chan struct{})
	var once sync.Once
	fire := func(how string) {
		once.Do(func() {
			log.Info("kubernetes: agent DaemonSet removed", "daemonset", dsName, "how", how)
			close(removed)
		})
	}
	// A plain get first, so that a missing RBAC rule is an error here rather
	// than an informer retrying forever.
	ds, err := api.GetDaemonSet(ctx, podNamespace, name)
	switch {
	case apierrors.IsNotFound(err):
		fire("not found at start")
		return removed, nil
	case err != nil:
		return nil, fmt.Errorf("kubernetes: get DaemonSet %s (owner of pod %s/%s): %w", dsName, podNamespace, podName, err)
	case ds.UID != uid:
		fire("replaced by a new DaemonSet of the same name")
		return removed, nil
	case ds.DeletionTimestamp != nil:
		fire("marked for deletion")
		return removed, nil
	}

	// check fires when obj is our DaemonSet going away; one of the same name
	// with another UID means ours was deleted.
	check := func(obj any) {
		ds, ok := obj.(*kubeapi.DaemonSet)
		if !ok || ds.Name != name { // fake clients ignore the field selector
			return
		}
		switch {
		case ds.UID != uid:
			fire("replaced by a new DaemonSet of the same name")
		case ds.DeletionTimestamp != nil:
			fire("marked for deletion")
		}
	}
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	store, ctl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.FieldSelector = sel
				return api.ListDaemonSets(ctx, podNamespace, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.FieldSelector = sel
				return api.WatchDaemonSets(ctx, podNamespace, o)
			},
		},
		ObjectType: &kubeapi.DaemonSet{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    check,
			UpdateFunc: func(_, obj any) { check(obj) },
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				if ds, ok := obj.(*kubeapi.DaemonSet); ok && ds.Name == name && ds.UID == uid {
					fire("deleted")
				}
			},
		},
	})
	go ctl.RunWithContext(ctx)
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), ctl.HasSynced) {
			return
		}
		// Deleted between the get and the first list: no event tells it.
		if _, ok, _ := store.GetByKey(dsName); !ok {
			fire("gone before the watch started")
		}
	}()
	log.Info("kubernetes: watching the agent DaemonSet for removal", "daemonset", dsName)
	return removed, nil
}
