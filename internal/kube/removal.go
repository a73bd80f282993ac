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
// but not when it is updated (a rolling update) or replaced by a DaemonSet of
// the same name (delete --cascade=orphan then create, replace --force: the
// new one's agent takes the node over). The channel stays open when ctx
// ends. It needs get on the pod and get/list/watch on that DaemonSet.
// The returned Removal re-reads the DaemonSet: the agent asks it again
// before it uninstalls, and on SIGTERM.
func WatchRemoval(ctx context.Context, cfg Config, podNamespace, podName string) (<-chan struct{}, *Removal, error) {
	api, err := NewAPI(cfg)
	if err != nil {
		return nil, nil, err
	}
	return WatchRemovalWith(ctx, cfg, api, podNamespace, podName)
}

// Removal reads the agent's DaemonSet from the API.
type Removal struct {
	api             API
	namespace, name string
	uid             types.UID
}

// Check re-reads the DaemonSet: removed is true when it is gone or ours is
// marked for deletion, and how says what was found. A DaemonSet of the same
// name with another UID is a replacement, not a removal (unless it is being
// deleted too). Refused credentials or permissions are a removal (helm
// uninstall deletes them with the DaemonSet); any other API error decides
// nothing: the caller keeps the datapath.
func (r *Removal) Check(ctx context.Context) (removed bool, how string, err error) {
	ds, err := r.api.GetDaemonSet(ctx, r.namespace, r.name)
	return removal(ds, err, r.uid)
}

func removal(ds *kubeapi.DaemonSet, err error, uid types.UID) (bool, string, error) {
	switch {
	case apierrors.IsNotFound(err):
		return true, "not found", nil
	case apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err):
		// The agent could read its DaemonSet at start. helm uninstall
		// deletes the chart's ServiceAccount (its token is then refused:
		// Unauthorized) and RBAC (Forbidden) right after the DaemonSet, so
		// by SIGTERM, or by the re-read after removalSettle, nothing can be
		// read any more: that is the removal. A replacement of the
		// DaemonSet alone keeps both (the re-read sees it), and a new agent
		// asking for the node's lock meanwhile still takes it over.
		return true, "access to the API revoked (" + err.Error() + "): the chart's ServiceAccount or RBAC went with the DaemonSet", nil
	case err != nil:
		return false, "", err
	case ds.DeletionTimestamp != nil:
		return true, "marked for deletion", nil
	case ds.UID != uid:
		return false, "replaced by a new DaemonSet of the same name (uid " + string(ds.UID) + ")", nil
	}
	return false, "present", nil
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
func WatchRemovalWith(ctx context.Context, cfg Config, api API, podNamespace, podName string) (<-chan struct{}, *Removal, error) {
	name, uid, err := DaemonSetOwner(ctx, api, podNamespace, podName)
	if err != nil {
		return nil, nil, err
	}
	rm := &Removal{api: api, namespace: podNamespace, name: name, uid: uid}
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
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("kubernetes: get DaemonSet %s (owner of pod %s/%s): %w", dsName, podNamespace, podName, err)
	}
	if gone, how, _ := removal(ds, err, uid); gone {
		fire(how + " at start")
		return removed, rm, nil
	} else if how != "present" {
		log.Info("kubernetes: agent DaemonSet "+how+": not a removal, the new DaemonSet's agent takes the node over", "daemonset", dsName)
	}

	// check fires when obj is our DaemonSet going away. One of the same name
	// with another UID is a replacement (its agent takes the node over
	// through the lock): logged, not a removal.
	replaced := ""
	check := func(obj any) {
		ds, ok := obj.(*kubeapi.DaemonSet)
		if !ok || ds.Name != name { // fake clients ignore the field selector
			return
		}
		gone, how, _ := removal(ds, nil, uid)
		if gone {
			fire(how)
		} else if how != "present" && how != replaced {
			replaced = how
			log.Info("kubernetes: agent DaemonSet "+how+": not a removal, the new DaemonSet's agent takes the node over", "daemonset", dsName)
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
				// A replacement deleted: nothing of ours is left.
				if ds, ok := obj.(*kubeapi.DaemonSet); ok && ds.Name == name && ds.UID != uid {
					fire("deleted (its replacement)")
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
	return removed, rm, nil
}
