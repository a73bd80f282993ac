package kube

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// API is the part of the Kubernetes API the package reads. NewAPI talks to
// an API server; the tests adapt client-go's fake clientset (fakeapi_test.go).
//
// The typed clientsets are not used here: they import client-go's scheme,
// which registers every API group and adds about 23 MB to the agent binary;
// nor are k8s.io/api's types (package kubeapi says why).
type API interface {
	ListPods(ctx context.Context, opts metav1.ListOptions) (*kubeapi.PodList, error)
	WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	GetPod(ctx context.Context, namespace, name string) (*kubeapi.Pod, error)
	ListNamespaces(ctx context.Context, opts metav1.ListOptions) (*kubeapi.NamespaceList, error)
	WatchNamespaces(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	GetDaemonSet(ctx context.Context, namespace, name string) (*kubeapi.DaemonSet, error)
	ListDaemonSets(ctx context.Context, namespace string, opts metav1.ListOptions) (*kubeapi.DaemonSetList, error)
	WatchDaemonSets(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
}

var paramCodec = kubeapi.ParameterCodec

// NewAPI connects with RESTConfig(cfg).
func NewAPI(cfg Config) (API, error) {
	rc, err := RESTConfig(cfg)
	if err != nil {
		return nil, err
	}
	return NewAPIForConfig(rc)
}

// NewAPIForConfig builds the API on a REST configuration.
func NewAPIForConfig(rc *rest.Config) (API, error) {
	core, err := restClient(rc, kubeapi.CoreV1, "/api")
	if err != nil {
		return nil, err
	}
	apps, err := restClient(rc, kubeapi.AppsV1, "/apis")
	if err != nil {
		return nil, err
	}
	return &restAPI{core: core, apps: apps}, nil
}

type restAPI struct{ core, apps *rest.RESTClient }

// The requests are the ones client-go's typed clients make, in JSON: the
// objects are kubeapi's, which have no protobuf code.

func get(ctx context.Context, c *rest.RESTClient, namespace, resource, name string, into runtime.Object) error {
	return c.Get().NamespaceIfScoped(namespace, namespace != "").
		Resource(resource).Name(name).VersionedParams(&metav1.GetOptions{}, paramCodec).Do(ctx).Into(into)
}

func list(ctx context.Context, c *rest.RESTClient, namespace, resource string, opts metav1.ListOptions, into runtime.Object) error {
	return request(c, namespace, resource, &opts).Do(ctx).Into(into)
}

func watchRes(ctx context.Context, c *rest.RESTClient, namespace, resource string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return request(c, namespace, resource, &opts).Watch(ctx)
}

// request is a list or watch of resource with opts, and the client-side
// timeout of opts.TimeoutSeconds, as client-go's typed clients set it.
func request(c *rest.RESTClient, namespace, resource string, opts *metav1.ListOptions) *rest.Request {
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	return c.Get().NamespaceIfScoped(namespace, namespace != "").
		Resource(resource).VersionedParams(opts, paramCodec).Timeout(timeout)
}

func (a *restAPI) ListPods(ctx context.Context, opts metav1.ListOptions) (*kubeapi.PodList, error) {
	out := &kubeapi.PodList{}
	return out, list(ctx, a.core, "", "pods", opts, out)
}

func (a *restAPI) WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return watchRes(ctx, a.core, "", "pods", opts)
}

func (a *restAPI) GetPod(ctx context.Context, namespace, name string) (*kubeapi.Pod, error) {
	out := &kubeapi.Pod{}
	return out, get(ctx, a.core, namespace, "pods", name, out)
}

func (a *restAPI) ListNamespaces(ctx context.Context, opts metav1.ListOptions) (*kubeapi.NamespaceList, error) {
	out := &kubeapi.NamespaceList{}
	return out, list(ctx, a.core, "", "namespaces", opts, out)
}

func (a *restAPI) WatchNamespaces(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return watchRes(ctx, a.core, "", "namespaces", opts)
}

func (a *restAPI) GetDaemonSet(ctx context.Context, namespace, name string) (*kubeapi.DaemonSet, error) {
	out := &kubeapi.DaemonSet{}
	return out, get(ctx, a.apps, namespace, "daemonsets", name, out)
}

func (a *restAPI) ListDaemonSets(ctx context.Context, namespace string, opts metav1.ListOptions) (*kubeapi.DaemonSetList, error) {
	out := &kubeapi.DaemonSetList{}
	return out, list(ctx, a.apps, namespace, "daemonsets", opts, out)
}

func (a *restAPI) WatchDaemonSets(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	return watchRes(ctx, a.apps, namespace, "daemonsets", opts)
}
