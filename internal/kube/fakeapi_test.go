// The API over client-go's (fake) clientset, for the tests: only tests may link the typed clientsets.
package kube

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// fromClientset returns cs as an API.
func fromClientset(cs kubernetes.Interface) API { return clientset{cs} }

type clientset struct{ cs kubernetes.Interface }

func (c clientset) ListPods(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
	return c.cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
}

func (c clientset) WatchPods(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return c.cs.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o)
}

func (c clientset) GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return c.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c clientset) ListNamespaces(ctx context.Context, o metav1.ListOptions) (*corev1.NamespaceList, error) {
	return c.cs.CoreV1().Namespaces().List(ctx, o)
}

func (c clientset) WatchNamespaces(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return c.cs.CoreV1().Namespaces().Watch(ctx, o)
}

func (c clientset) GetDaemonSet(ctx context.Context, ns, name string) (*appsv1.DaemonSet, error) {
	return c.cs.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c clientset) ListDaemonSets(ctx context.Context, ns string, o metav1.ListOptions) (*appsv1.DaemonSetList, error) {
	return c.cs.AppsV1().DaemonSets(ns).List(ctx, o)
}

func (c clientset) WatchDaemonSets(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	return c.cs.AppsV1().DaemonSets(ns).Watch(ctx, o)
}
