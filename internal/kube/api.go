package kube

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// API is the part of the Kubernetes API the package reads. NewAPI talks to
// an API server; the tests adapt client-go's fake clientset (fakeapi_test.go).
//
// The typed clientsets are not used here: they import client-go's scheme,
// which registers every API group and adds about 23 MB to the agent binary.
type API interface {
	ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	ListNamespaces(ctx context.Context, opts metav1.ListOptions) (*corev1.NamespaceList, error)
	WatchNamespaces(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	GetDaemonSet(ctx context.Context, namespace, name string) (*appsv1.DaemonSet, error)
	ListDaemonSets(ctx context.Context, namespace string, opts metav1.ListOptions) (*appsv1.DaemonSetList, error)
	WatchDaemonSets(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
}

// scheme holds core/v1, apps/v1 and discovery/v1 only.
var (
	scheme     = runtime.NewScheme()
	codecs     = serializer.NewCodecFactory(scheme)
	paramCodec = runtime.NewParameterCodec(scheme)
)

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(appsv1.AddToScheme(scheme))
	utilruntime.Must(discoveryv1.AddToScheme(scheme))
}

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
	core, err := restClient(rc, &corev1.SchemeGroupVersion, "/api", false)
	if err != nil {
		return nil, err
	}
	apps, err := restClient(rc, &appsv1.SchemeGroupVersion, "/apis", false)
	if err != nil {
		return nil, err
	}
	return &restAPI{core: core, apps: apps}, nil
}

type restAPI struct{ core, apps *rest.RESTClient }

// The requests are the ones client-go's typed clients make (protobuf
// preferred, as they do for built-in types).

func get(ctx context.Context, c *rest.RESTClient, namespace, resource, name string, into runtime.Object) error {
	return c.Get().UseProtobufAsDefaultIfPreferred(true).NamespaceIfScoped(namespace, namespace != "").
		Resource(resource).Name(name).VersionedParams(&metav1.GetOptions{}, paramCodec).Do(ctx).Into(into)
}

func list(ctx context.Context, c *rest.RESTClient, namespace, resource string, opts metav1.ListOptions, into runtime.Object) error {
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	return c.Get().UseProtobufAsDefaultIfPreferred(true).NamespaceIfScoped(namespace, namespace != "").
		Resource(resource).VersionedParams(&opts, paramCodec).Timeout(timeout).Do(ctx).Into(into)
}

func watchRes(ctx context.Context, c *rest.RESTClient, namespace, resource string, opts metav1.ListOptions) (watch.Interface, error) {
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	opts.Watch = true
	return c.Get().UseProtobufAsDefaultIfPreferred(true).NamespaceIfScoped(namespace, namespace != "").
		Resource(resource).VersionedParams(&opts, paramCodec).Timeout(timeout).Watch(ctx)
}

func (a *restAPI) ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	return out, list(ctx, a.core, "", "pods", opts, out)
}

func (a *restAPI) WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return watchRes(ctx, a.core, "", "pods", opts)
}

func (a *restAPI) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	return out, get(ctx, a.core, namespace, "pods", name, out)
}

func (a *restAPI) ListNamespaces(ctx context.Context, opts metav1.ListOptions) (*corev1.NamespaceList, error) {
	out := &corev1.NamespaceList{}
	return out, list(ctx, a.core, "", "namespaces", opts, out)
}

func (a *restAPI) WatchNamespaces(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return watchRes(ctx, a.core, "", "namespaces", opts)
}

func (a *restAPI) GetDaemonSet(ctx context.Context, namespace, name string) (*appsv1.DaemonSet, error) {
	out := &appsv1.DaemonSet{}
	return out, get(ctx, a.apps, namespace, "daemonsets", name, out)
}

func (a *restAPI) ListDaemonSets(ctx context.Context, namespace string, opts metav1.ListOptions) (*appsv1.DaemonSetList, error) {
	out := &appsv1.DaemonSetList{}
	return out, list(ctx, a.apps, namespace, "daemonsets", opts, out)
}

func (a *restAPI) WatchDaemonSets(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	return watchRes(ctx, a.apps, namespace, "daemonsets", opts)
}
