package services

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/eztunnel/eztunnel/lab/multinode"
)

const (
	namespace = "svcbench"
	// MaxNodePorts is the paper's split: the first 2767 Services are
	// NodePort (externalTrafficPolicy Local), the rest ClusterIP.
	MaxNodePorts  = 2767
	nodePortBase  = 30000
	svcPort       = 80
	targetPort    = 7000 // every backend serves here
	closedPort    = 7009 // nothing listens: a connect is refused
	createWorkers = 32
)

func svcName(i int) string { return fmt.Sprintf("s%05d", i) }

// nodePort of Service i (0 for a ClusterIP Service).
func nodePort(i int) int {
	if i < MaxNodePorts {
		return nodePortBase + i
	}
	return 0
}

// createNode writes the lab node as a Node object with the addresses and
// pod CIDRs kube-proxy and the agent read (no kubelet runs).
func createNode(ctx context.Context, cs kubernetes.Interface, n *multinode.Node) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name},
		Spec: corev1.NodeSpec{PodCIDR: n.PodCIDRv4.String(), PodCIDRs: []string{n.PodCIDRv4.String(), n.PodCIDRv6.String()}}}
	got, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	got.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: n.UnderlayV4.String()},
		{Type: corev1.NodeInternalIP, Address: n.UnderlayV6.String()},
		{Type: corev1.NodeHostName, Address: n.Name},
	}
	got.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "Bench", Message: "set by bench services"}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", n.Name, err)
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	return err
}

// service i: dual-stack, one TCP port; NodePort with eTP Local for the
// first MaxNodePorts.
func service(i int) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName(i), Namespace: namespace},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports:          []corev1.ServicePort{{Port: svcPort, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(targetPort)}},
		}}
	if np := nodePort(i); np != 0 {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.Ports[0].NodePort = int32(np)
	}
	return s
}

// slice is Service i's EndpointSlice of one family: one ready endpoint on
// this node, backend, at port.
func slice(i int, v6 bool, backend *multinode.Pod, node string, port int32) *discoveryv1.EndpointSlice {
	fam, at := "v4", discoveryv1.AddressTypeIPv4
	if v6 {
		fam, at = "v6", discoveryv1.AddressTypeIPv6
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svcName(i) + "-" + fam, Namespace: namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: svcName(i), discoveryv1.LabelManagedBy: "eztunnel-bench"}},
		AddressType: at,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(""), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{backend.Addr(v6).String()}, NodeName: ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}}},
	}
}

// VIPs of the Services created so far, by index.
type vips struct {
	mu     sync.Mutex
	v4, v6 []string // ClusterIP:port
}

// createServices creates Services from..to-1 and their two EndpointSlices
// with createWorkers parallel writers; backends are taken round-robin.
func createServices(ctx context.Context, cs kubernetes.Interface, from, to int, backends []*multinode.Pod, node string, v *vips) (time.Duration, error) {
	t0 := time.Now()
	v.mu.Lock()
	for len(v.v4) < to {
		v.v4, v.v6 = append(v.v4, ""), append(v.v6, "")
	}
	v.mu.Unlock()
	idx := make(chan int)
	errs := make(chan error, createWorkers)
	var wg sync.WaitGroup
	for range createWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				s, err := cs.CoreV1().Services(namespace).Create(ctx, service(i), metav1.CreateOptions{})
				if err != nil {
					errs <- fmt.Errorf("service %d: %w", i, err)
					return
				}
				b := backends[i%len(backends)]
				for _, v6 := range []bool{false, true} {
					if _, err := cs.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice(i, v6, b, node, targetPort), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
						errs <- fmt.Errorf("slice %d: %w", i, err)
						return
					}
				}
				if len(s.Spec.ClusterIPs) != 2 {
					errs <- fmt.Errorf("service %d: ClusterIPs %v, want one per family", i, s.Spec.ClusterIPs)
					return
				}
				v.mu.Lock()
				v.v4[i] = fmt.Sprintf("%s:%d", s.Spec.ClusterIPs[0], svcPort)
				v.v6[i] = fmt.Sprintf("[%s]:%d", s.Spec.ClusterIPs[1], svcPort)
				v.mu.Unlock()
			}
		}()
	}
	var err error
feed:
	for i := from; i < to; i++ {
		select {
		case idx <- i:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(idx)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return time.Since(t0), err
}

// setSlicePort points Service i's slice of one family at port (its
// endpoint kept): closedPort makes connects refused, targetPort accepted.
func setSlicePort(ctx context.Context, cs kubernetes.Interface, i int, v6 bool, backends []*multinode.Pod, node string, port int32) error {
	want := slice(i, v6, backends[i%len(backends)], node, port)
	cur, err := cs.DiscoveryV1().EndpointSlices(namespace).Get(ctx, want.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	want.ResourceVersion = cur.ResourceVersion
	// As the EndpointSlice controller does: kube-proxy's
	// network_programming_duration_seconds starts at this time.
	want.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}
	_, err = cs.DiscoveryV1().EndpointSlices(namespace).Update(ctx, want, metav1.UpdateOptions{})
	return err
}
