package kubeapi

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
)

// BenchmarkDecodeLists: the agent's first list of 10,000 Services and
// their 10,000 EndpointSlices, as JSON into this package's objects (what
// the agent does) and as protobuf into k8s.io/api's (what it did, with
// client-go's typed objects): the price of leaving k8s.io/api out.
func BenchmarkDecodeLists(b *testing.B) {
	const n = 10000
	svcs := &corev1.ServiceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceList"}}
	sls := &discoveryv1.EndpointSliceList{TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSliceList"}}
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svcs.Items = append(svcs.Items, corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench", UID: "0b7f6f1e-3d5c-4c9a-9f4e-6a1b2c3d4e5f", ResourceVersion: "123456",
				Labels: map[string]string{"app": name}, Annotations: map[string]string{"note": "x"}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1),
				ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)}, Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		})
		sls.Items = append(sls.Items, discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-abcde", Namespace: "bench", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.244.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node-1")},
				{Addresses: []string{"10.244.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node-1")},
			},
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		})
	}
	for _, l := range []struct {
		name     string
		up, ours runtime.Object
	}{{"services", svcs, &ServiceList{}}, {"endpointslices", sls, &EndpointSliceList{}}} {
		jsonInfo, _ := runtime.SerializerInfoForMediaType(Codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
		upCodecs := clientscheme.Codecs
		pbInfo, _ := runtime.SerializerInfoForMediaType(upCodecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
		jsonBytes, err := runtime.Encode(upCodecs.LegacyCodec(corev1.SchemeGroupVersion, discoveryv1.SchemeGroupVersion), l.up)
		if err != nil {
			b.Fatal(err)
		}
		pbBytes, err := runtime.Encode(pbInfo.Serializer, l.up)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(l.name+"/json-kubeapi", func(b *testing.B) {
			b.SetBytes(int64(len(jsonBytes)))
			for b.Loop() {
				into := l.ours.DeepCopyObject()
				if _, _, err := jsonInfo.Serializer.Decode(jsonBytes, nil, into); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(l.name+"/protobuf-k8s.io-api", func(b *testing.B) {
			b.SetBytes(int64(len(pbBytes)))
			for b.Loop() {
				into := l.up.DeepCopyObject()
				if _, _, err := pbInfo.Serializer.Decode(pbBytes, nil, into); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
