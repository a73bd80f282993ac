package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
)

func daemonSet(name, uid string) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "eztunnel", Name: name, UID: types.UID(uid)}}
}

func agentPod(owners ...metav1.OwnerReference) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "eztunnel", Name: "eztunnel-abcde", OwnerReferences: owners}}
}

func dsOwner(name, uid string) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: name, UID: types.UID(uid)}
}

func closed(ch <-chan struct{}, wait time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-time.After(wait):
		return false
	}
}

// startRemoval starts WatchRemovalWith on a fake cluster and waits until its
// DaemonSet watch is in place.
func startRemoval(t *testing.T, ctx context.Context, objs ...runtime.Object) (*fakeCluster, <-chan struct{}) {
	fc, ch, _ := startRemovalCheck(t, ctx, objs...)
	return fc, ch
}

func startRemovalCheck(t *testing.T, ctx context.Context, objs ...runtime.Object) (*fakeCluster, <-chan struct{}, *Removal) {
	t.Helper()
	fc := newFakeCluster(t, objs...)
	ch, rm, err := WatchRemovalWith(ctx, Config{}, fromClientset(fc.cs), "eztunnel", "eztunnel-abcde")
	if err != nil {
		t.Fatal(err)
	}
	fc.waitWatches("daemonsets")
	return fc, ch, rm
}

func TestWatchRemovalDelete(t *testing.T) {
	ctx := t.Context()
	fc, ch := startRemoval(t, ctx, agentPod(dsOwner("eztunnel", "ds-1")), daemonSet("eztunnel", "ds-1"), daemonSet("other", "ds-2"))
	dsc := fc.cs.AppsV1().DaemonSets("eztunnel")

	// A rolling update (the DaemonSet changes but stays) and another
	// DaemonSet's deletion leave the channel open.
	ds := daemonSet("eztunnel", "ds-1")
	ds.Spec.Template.Spec.Containers = []corev1.Container{{Name: "agent", Image: "eztunnel:v2"}}
	if _, err := dsc.Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := dsc.Delete(ctx, "other", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if closed(ch, 500*time.Millisecond) {
		t.Fatal("closed on an update or another DaemonSet's deletion")
	}
	if err := dsc.Delete(ctx, "eztunnel", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !closed(ch, 10*time.Second) {
		t.Fatal("not closed after the DaemonSet was deleted")
	}
}

func TestWatchRemovalDeletionTimestamp(t *testing.T) {
	ctx := t.Context()
	fc, ch := startRemoval(t, ctx, agentPod(dsOwner("eztunnel", "ds-1")), daemonSet("eztunnel", "ds-1"))
	ds := daemonSet("eztunnel", "ds-1")
	now := metav1.Now()
	ds.DeletionTimestamp = &now
	ds.Finalizers = []string{"foregroundDeletion"}
	if _, err := fc.cs.AppsV1().DaemonSets("eztunnel").Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !closed(ch, 10*time.Second) {
		t.Fatal("not closed after the DaemonSet was marked for deletion")
	}
}

// TestWatchRemovalReplaced: a DaemonSet of the same name with another UID
// (delete --cascade=orphan then create, replace --force, helm upgrade
// --force) is a replacement whose agent takes the node over: not a removal,
// and Check says so. Once the replacement is deleted too, it is one.
func TestWatchRemovalReplaced(t *testing.T) {
	ctx := t.Context()
	fc, ch, rm := startRemovalCheck(t, ctx, agentPod(dsOwner("eztunnel", "ds-1")), daemonSet("eztunnel", "ds-1"))
	dsc := fc.cs.AppsV1().DaemonSets("eztunnel")
	if gone, how, err := rm.Check(ctx); gone || err != nil || how != "present" {
		t.Fatalf("Check before: %v %q %v", gone, how, err)
	}
	if _, err := dsc.Update(ctx, daemonSet("eztunnel", "ds-9"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if closed(ch, 500*time.Millisecond) {
		t.Fatal("closed after the DaemonSet was replaced: its new agent takes over, nothing to uninstall")
	}
	if gone, how, err := rm.Check(ctx); gone || err != nil || !strings.Contains(how, "replaced") {
		t.Fatalf("Check after the replacement: %v %q %v", gone, how, err)
	}
	if err := dsc.Delete(ctx, "eztunnel", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !closed(ch, 10*time.Second) {
		t.Fatal("not closed after the replacement was deleted")
	}
	if gone, how, err := rm.Check(ctx); !gone || err != nil || how != "not found" {
		t.Fatalf("Check after the deletion: %v %q %v", gone, how, err)
	}
}

// TestRemovalCheck: what Check says of each state the DaemonSet can be in
// when SIGTERM comes; an API error decides nothing, but refused credentials
// or permissions (helm uninstall deleted them) are a removal.
func TestRemovalCheck(t *testing.T) {
	ctx := t.Context()
	now := metav1.Now()
	marked := daemonSet("eztunnel", "ds-1")
	marked.DeletionTimestamp, marked.Finalizers = &now, []string{"foregroundDeletion"}
	markedNew := daemonSet("eztunnel", "ds-9")
	markedNew.DeletionTimestamp, markedNew.Finalizers = &now, []string{"foregroundDeletion"}
	for _, c := range []struct {
		name string
		ds   *appsv1.DaemonSet
		gone bool
		how  string
	}{
		{"present", daemonSet("eztunnel", "ds-1"), false, "present"},
		{"marked for deletion", marked, true, "marked for deletion"},
		{"replaced", daemonSet("eztunnel", "ds-9"), false, "replaced by a new DaemonSet of the same name (uid ds-9)"},
		{"replacement marked for deletion", markedNew, true, "marked for deletion"},
	} {
		fc, _, rm := startRemovalCheck(t, ctx, agentPod(dsOwner("eztunnel", "ds-1")), daemonSet("eztunnel", "ds-1"))
		if _, err := fc.cs.AppsV1().DaemonSets("eztunnel").Update(ctx, c.ds, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if gone, how, err := rm.Check(ctx); gone != c.gone || how != c.how || err != nil {
			t.Errorf("%s: Check = %v %q %v, want %v %q", c.name, gone, how, err, c.gone, c.how)
		}
		var fail error = apierrors.NewServiceUnavailable("etcd down")
		fc.cs.PrependReactor("get", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, fail
		})
		if gone, _, err := rm.Check(ctx); gone || err == nil {
			t.Errorf("%s, API failing: Check = %v %v, want an error and no removal", c.name, gone, err)
		}
		// helm uninstall removes the ServiceAccount and RBAC with the
		// DaemonSet: refused credentials or permissions are the removal.
		for _, refused := range []*apierrors.StatusError{
			apierrors.NewUnauthorized("Unauthorized"),
			apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "eztunnel", nil),
		} {
			fail = refused
			if gone, how, err := rm.Check(ctx); !gone || err != nil || !strings.Contains(how, "access to the API revoked") {
				t.Errorf("%s, API refusing (%v): Check = %v %q %v, want a removal", c.name, refused, gone, how, err)
			}
		}
	}
}

func TestWatchRemovalAlreadyGone(t *testing.T) {
	fc := newFakeCluster(t, agentPod(dsOwner("eztunnel", "ds-1")))
	ch, _, err := WatchRemovalWith(t.Context(), Config{}, fromClientset(fc.cs), "eztunnel", "eztunnel-abcde")
	if err != nil {
		t.Fatal(err)
	}
	if !closed(ch, 0) {
		t.Fatal("not closed although the DaemonSet does not exist")
	}
}

func TestWatchRemovalErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		objs []runtime.Object
		ns   string
		pod  string
		want string
	}{
		{"no owner", []runtime.Object{agentPod()}, "eztunnel", "eztunnel-abcde", "eztunnel/eztunnel-abcde has no DaemonSet owner"},
		{"other owner", []runtime.Object{agentPod(metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs"})}, "eztunnel", "eztunnel-abcde", "has no DaemonSet owner"},
		{"no pod", nil, "eztunnel", "eztunnel-abcde", "get agent pod eztunnel/eztunnel-abcde"},
		{"no name", nil, "eztunnel", "", "POD_NAME"},
	} {
		fc := newFakeCluster(t, c.objs...)
		_, _, err := WatchRemovalWith(t.Context(), Config{}, fromClientset(fc.cs), c.ns, c.pod)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q in it", c.name, err, c.want)
		}
	}
	// RBAC missing for the DaemonSet: an error now, not a silent retry loop.
	fc := newFakeCluster(t, agentPod(dsOwner("eztunnel", "ds-1")), daemonSet("eztunnel", "ds-1"))
	fc.cs.PrependReactor("get", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "eztunnel", nil)
	})
	_, _, err := WatchRemovalWith(t.Context(), Config{}, fromClientset(fc.cs), "eztunnel", "eztunnel-abcde")
	if err == nil || !strings.Contains(err.Error(), "DaemonSet eztunnel/eztunnel") || !apierrors.IsForbidden(err) {
		t.Errorf("forbidden: err = %v", err)
	}
}
