package kubeapi

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
)

// pairs are each object of this package and its upstream type.
var pairs = []struct{ ours, up runtime.Object }{
	{&Pod{}, &corev1.Pod{}}, {&PodList{}, &corev1.PodList{}},
	{&Namespace{}, &corev1.Namespace{}}, {&NamespaceList{}, &corev1.NamespaceList{}},
	{&Node{}, &corev1.Node{}}, {&NodeList{}, &corev1.NodeList{}},
	{&Service{}, &corev1.Service{}}, {&ServiceList{}, &corev1.ServiceList{}},
	{&EndpointSlice{}, &discoveryv1.EndpointSlice{}}, {&EndpointSliceList{}, &discoveryv1.EndpointSliceList{}},
	{&DaemonSet{}, &appsv1.DaemonSet{}}, {&DaemonSetList{}, &appsv1.DaemonSetList{}},
}

// TestFieldsMatchUpstream walks every field of every object, down to the
// leaves: the upstream type has a field of the same name, JSON key and
// kind, so the API server's JSON fills each one as it fills upstream's.
func TestFieldsMatchUpstream(t *testing.T) {
	for _, p := range pairs {
		ours, up := reflect.TypeOf(p.ours).Elem(), reflect.TypeOf(p.up).Elem()
		if ours.Name() != up.Name() {
			t.Errorf("%s pairs with upstream %s: names differ", ours, up)
		}
		sameShape(t, ours.Name(), ours, up)
	}
}

func sameShape(t *testing.T, path string, ours, up reflect.Type) {
	t.Helper()
	if ours == up {
		return // a shared type (metav1's, or a basic type)
	}
	if ours.Kind() != up.Kind() {
		t.Errorf("%s: kind %s, upstream %s (%s)", path, ours.Kind(), up.Kind(), up)
		return
	}
	if ours.PkgPath() != reflect.TypeOf(Pod{}).PkgPath() && ours.PkgPath() != "" {
		t.Errorf("%s: type %s from neither this package nor upstream's %s", path, ours, up)
		return
	}
	switch ours.Kind() {
	case reflect.Pointer, reflect.Slice:
		sameShape(t, path+"[]", ours.Elem(), up.Elem())
	case reflect.Map:
		sameShape(t, path+"[key]", ours.Key(), up.Key())
		sameShape(t, path+"[]", ours.Elem(), up.Elem())
	case reflect.Struct:
		if ours.Name() != up.Name() {
			t.Errorf("%s: type %s, upstream %s", path, ours.Name(), up.Name())
		}
		for i := range ours.NumField() {
			f := ours.Field(i)
			uf, ok := up.FieldByName(f.Name)
			if !ok || len(uf.Index) != 1 {
				t.Errorf("%s.%s: upstream %s has no such field", path, f.Name, up)
				continue
			}
			if f.Tag.Get("json") != uf.Tag.Get("json") {
				t.Errorf("%s.%s: json tag %q, upstream %q", path, f.Name, f.Tag.Get("json"), uf.Tag.Get("json"))
			}
			sameShape(t, path+"."+f.Name, f.Type, uf.Type)
		}
	case reflect.String, reflect.Bool, reflect.Int32, reflect.Int64:
		// A named basic type (Protocol, ServiceType, ...): same kind is enough.
	default:
		t.Errorf("%s: unexpected kind %s", path, ours.Kind())
	}
}

// TestKindsMatchUpstream: each object is registered under the group,
// version and kind client-go's scheme gives its upstream type.
func TestKindsMatchUpstream(t *testing.T) {
	for _, p := range pairs {
		want, _, err := clientscheme.Scheme.ObjectKinds(p.up)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := Scheme.ObjectKinds(p.ours)
		if err != nil {
			t.Errorf("%T: %v", p.ours, err)
			continue
		}
		if len(got) != 1 || got[0] != want[0] {
			t.Errorf("%T: kinds %v, upstream %v", p.ours, got, want)
		}
	}
}

// TestDecodesUpstreamJSON decodes upstream objects, as the API server
// serves them (with the fields this package leaves out), and checks what
// it keeps.
func TestDecodesUpstreamJSON(t *testing.T) {
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", Labels: map[string]string{"a": "b"}, ResourceVersion: "7"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00::a"},
			Ports:                 []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolUDP, Port: 80, NodePort: 30080, TargetPort: intstr.FromInt32(8080)}},
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 31000,
			InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyLocal),
			Selector:              map[string]string{"app": "web"},
			ExternalIPs:           []string{"198.51.100.1"},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
			{IP: "192.0.2.1"}, {IP: "192.0.2.2", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}, {Hostname: "lb.example"}}}},
	}
	got := &Service{}
	decode(t, svc, got)
	want := &Service{
		TypeMeta: svc.TypeMeta, ObjectMeta: svc.ObjectMeta,
		Spec: ServiceSpec{
			Type: ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00::a"},
			Ports:                 []ServicePort{{Name: "http", Protocol: ProtocolUDP, Port: 80, NodePort: 30080}},
			SessionAffinity:       ServiceAffinityClientIP,
			SessionAffinityConfig: &SessionAffinityConfig{ClientIP: &ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}},
			ExternalTrafficPolicy: ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 31000,
			InternalTrafficPolicy: ptr.To(ServiceInternalTrafficPolicyLocal),
			ExternalIPs:           []string{"198.51.100.1"},
		},
		Status: ServiceStatus{LoadBalancer: LoadBalancerStatus{Ingress: []LoadBalancerIngress{
			{IP: "192.0.2.1"}, {IP: "192.0.2.2", IPMode: ptr.To(LoadBalancerIPModeProxy)}, {}}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Service:\n got %+v\nwant %+v", got, want)
	}

	sl := &discoveryv1.EndpointSlice{
		TypeMeta:    metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "ns", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.0.0.1"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(false), Terminating: ptr.To(true)},
			NodeName:   ptr.To("n1"), Zone: ptr.To("z1"),
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080), AppProtocol: ptr.To("h2c")}},
	}
	gotSl := &EndpointSlice{}
	decode(t, sl, gotSl)
	wantSl := &EndpointSlice{
		TypeMeta: sl.TypeMeta, ObjectMeta: sl.ObjectMeta, AddressType: AddressTypeIPv4,
		Endpoints: []Endpoint{{
			Addresses:  []string{"10.0.0.1"},
			Conditions: EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(false), Terminating: ptr.To(true)},
			NodeName:   ptr.To("n1"), Hints: &EndpointHints{ForZones: []ForZone{{Name: "z1"}}},
		}},
		Ports: []EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	if !reflect.DeepEqual(gotSl, wantSl) {
		t.Errorf("EndpointSlice:\n got %+v\nwant %+v", gotSl, wantSl)
	}

	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1", Annotations: map[string]string{"k": "v"}},
		Spec:       corev1.PodSpec{NodeName: "n1", HostNetwork: true, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBurstable, PodIP: "10.0.0.2",
			PodIPs: []corev1.PodIP{{IP: "10.0.0.2"}, {IP: "fd00::2"}}},
	}
	gotPod := &Pod{}
	decode(t, pod, gotPod)
	wantPod := &Pod{TypeMeta: pod.TypeMeta, ObjectMeta: pod.ObjectMeta, Spec: PodSpec{NodeName: "n1", HostNetwork: true},
		Status: PodStatus{Phase: PodRunning, QOSClass: PodQOSBurstable, PodIP: "10.0.0.2", PodIPs: []PodIP{{IP: "10.0.0.2"}, {IP: "fd00::2"}}}}
	if !reflect.DeepEqual(gotPod, wantPod) {
		t.Errorf("Pod:\n got %+v\nwant %+v", gotPod, wantPod)
	}
	if c := gotPod.DeepCopyObject().(*Pod); !reflect.DeepEqual(c, gotPod) || &c.Status.PodIPs[0] == &gotPod.Status.PodIPs[0] {
		t.Errorf("DeepCopyObject: %+v, shares memory or differs", c)
	}
}

// decode encodes up as JSON and decodes it with Codecs, as a REST client
// of this package's scheme does.
func decode(t *testing.T, up runtime.Object, into runtime.Object) {
	t.Helper()
	b, err := json.Marshal(up)
	if err != nil {
		t.Fatal(err)
	}
	obj, gvk, err := Codecs.UniversalDeserializer().Decode(b, nil, into)
	if err != nil {
		t.Fatalf("decode %s: %v", strings.TrimSpace(string(b)), err)
	}
	if obj != into {
		t.Fatalf("decoded %s into a new %T", gvk, obj)
	}
}
