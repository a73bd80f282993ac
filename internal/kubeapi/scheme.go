package kubeapi

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// The group versions of the objects.
var (
	CoreV1      = schema.GroupVersion{Group: "", Version: "v1"}
	AppsV1      = schema.GroupVersion{Group: "apps", Version: "v1"}
	DiscoveryV1 = schema.GroupVersion{Group: "discovery.k8s.io", Version: "v1"}
)

// Scheme knows this package's objects (and metav1's options, lists and
// watch events) under their upstream kinds; Codecs decode them from JSON.
var (
	Scheme         = runtime.NewScheme()
	Codecs         = serializer.NewCodecFactory(Scheme)
	ParameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	add := func(gv schema.GroupVersion, objs ...runtime.Object) {
		Scheme.AddKnownTypes(gv, objs...)
		metav1.AddToGroupVersion(Scheme, gv)
	}
	add(CoreV1, &Pod{}, &PodList{}, &Namespace{}, &NamespaceList{}, &Node{}, &NodeList{}, &Service{}, &ServiceList{})
	add(DiscoveryV1, &EndpointSlice{}, &EndpointSliceList{})
	add(AppsV1, &DaemonSet{}, &DaemonSetList{})
}
