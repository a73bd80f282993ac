// The API over client-go's (fake) clientset, for the tests: only tests may
// link the typed clientsets. The clientset's objects (k8s.io/api's) are
// handed on as kubeapi's, through JSON as the API server sends them.
package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// fromClientset returns cs as an API.
func fromClientset(cs kubernetes.Interface) API { return clientset{cs} }

type clientset struct{ cs kubernetes.Interface }

// asAPI is the kubeapi object of an upstream one (the type of the same
// name), through JSON; other objects (metav1.Status) are returned as they are.
func asAPI(obj runtime.Object) runtime.Object {
	name := reflect.TypeOf(obj).Elem().Name()
	t, ok := map[string]runtime.Object{
		"Pod": &kubeapi.Pod{}, "PodList": &kubeapi.PodList{}, "Namespace": &kubeapi.Namespace{},
		"NamespaceList": &kubeapi.NamespaceList{}, "DaemonSet": &kubeapi.DaemonSet{}, "DaemonSetList": &kubeapi.DaemonSetList{},
	}[name]
	if !ok {
		return obj
	}
	b, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	out := reflect.New(reflect.TypeOf(t).Elem()).Interface().(runtime.Object)
	if err := json.Unmarshal(b, out); err != nil {
		panic(fmt.Sprintf("%s as kubeapi's: %v", name, err))
	}
	return out
}

// conv is asAPI of a clientset's answer.
func conv[T runtime.Object](obj runtime.Object, err error) (T, error) {
	var zero T
	if err != nil {
		return zero, err
	}
	return asAPI(obj).(T), nil
}

func convWatch(w watch.Interface, err error) (watch.Interface, error) {
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
		e.Object = asAPI(e.Object)
		return e, true
	}), nil
}

func (c clientset) ListPods(ctx context.Context, o metav1.ListOptions) (*kubeapi.PodList, error) {
	return conv[*kubeapi.PodList](c.cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o))
}

func (c clientset) WatchPods(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return convWatch(c.cs.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o))
}

func (c clientset) GetPod(ctx context.Context, ns, name string) (*kubeapi.Pod, error) {
	return conv[*kubeapi.Pod](c.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}))
}

func (c clientset) ListNamespaces(ctx context.Context, o metav1.ListOptions) (*kubeapi.NamespaceList, error) {
	return conv[*kubeapi.NamespaceList](c.cs.CoreV1().Namespaces().List(ctx, o))
}

func (c clientset) WatchNamespaces(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return convWatch(c.cs.CoreV1().Namespaces().Watch(ctx, o))
}

func (c clientset) GetDaemonSet(ctx context.Context, ns, name string) (*kubeapi.DaemonSet, error) {
	return conv[*kubeapi.DaemonSet](c.cs.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{}))
}

func (c clientset) ListDaemonSets(ctx context.Context, ns string, o metav1.ListOptions) (*kubeapi.DaemonSetList, error) {
	return conv[*kubeapi.DaemonSetList](c.cs.AppsV1().DaemonSets(ns).List(ctx, o))
}

func (c clientset) WatchDaemonSets(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	return convWatch(c.cs.AppsV1().DaemonSets(ns).Watch(ctx, o))
}
