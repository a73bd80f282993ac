package kubeapi

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// core/v1

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Pod is core/v1 Pod.
type Pod struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PodSpec   `json:"spec,omitempty"`
	Status            PodStatus `json:"status,omitempty"`
}

// PodSpec is the part of core/v1 PodSpec the agent reads.
type PodSpec struct {
	NodeName    string `json:"nodeName,omitempty"`
	HostNetwork bool   `json:"hostNetwork,omitempty"`
}

// PodStatus is the part of core/v1 PodStatus the agent reads.
type PodStatus struct {
	Phase    PodPhase    `json:"phase,omitempty"`
	PodIP    string      `json:"podIP,omitempty"`
	PodIPs   []PodIP     `json:"podIPs,omitempty"`
	QOSClass PodQOSClass `json:"qosClass,omitempty"`
}

// PodIP is core/v1 PodIP.
type PodIP struct {
	IP string `json:"ip"`
}

// PodPhase is core/v1 PodPhase.
type PodPhase string

const (
	PodPending   PodPhase = "Pending"
	PodRunning   PodPhase = "Running"
	PodSucceeded PodPhase = "Succeeded"
	PodFailed    PodPhase = "Failed"
)

// PodQOSClass is core/v1 PodQOSClass.
type PodQOSClass string

const (
	PodQOSGuaranteed PodQOSClass = "Guaranteed"
	PodQOSBurstable  PodQOSClass = "Burstable"
	PodQOSBestEffort PodQOSClass = "BestEffort"
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// PodList is core/v1 PodList.
type PodList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Pod `json:"items"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Namespace is core/v1 Namespace (its metadata).
type Namespace struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// NamespaceList is core/v1 NamespaceList.
type NamespaceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Namespace `json:"items"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Node is core/v1 Node (its metadata: the zone label).
type Node struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// NodeList is core/v1 NodeList.
type NodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Node `json:"items"`
}

// LabelTopologyZone is the node label of its topology zone (core/v1).
const LabelTopologyZone = "topology.kubernetes.io/zone"

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Service is core/v1 Service.
type Service struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ServiceSpec   `json:"spec,omitempty"`
	Status            ServiceStatus `json:"status,omitempty"`
}

// ServiceStatus is the part of core/v1 ServiceStatus the load balancer reads.
type ServiceStatus struct {
	LoadBalancer LoadBalancerStatus `json:"loadBalancer,omitempty"`
}

// LoadBalancerStatus is core/v1 LoadBalancerStatus.
type LoadBalancerStatus struct {
	Ingress []LoadBalancerIngress `json:"ingress,omitempty"`
}

// LoadBalancerIngress is the part of core/v1 LoadBalancerIngress the load
// balancer reads.
type LoadBalancerIngress struct {
	IP     string              `json:"ip,omitempty"`
	IPMode *LoadBalancerIPMode `json:"ipMode,omitempty"`
}

// LoadBalancerIPMode is core/v1 LoadBalancerIPMode.
type LoadBalancerIPMode string

const (
	// LoadBalancerIPModeVIP: the load balancer sends packets to the nodes
	// with the IP as destination; in-cluster traffic to it is translated.
	LoadBalancerIPModeVIP LoadBalancerIPMode = "VIP"
	// LoadBalancerIPModeProxy: the load balancer proxies; in-cluster
	// traffic to the IP goes to it (kube-proxy does not translate it).
	LoadBalancerIPModeProxy LoadBalancerIPMode = "Proxy"
)

// ServiceSpec is the part of core/v1 ServiceSpec the Service load balancer
// reads.
type ServiceSpec struct {
	Ports                 []ServicePort                 `json:"ports,omitempty"`
	ClusterIP             string                        `json:"clusterIP,omitempty"`
	ClusterIPs            []string                      `json:"clusterIPs,omitempty"`
	Type                  ServiceType                   `json:"type,omitempty"`
	ExternalIPs           []string                      `json:"externalIPs,omitempty"`
	SessionAffinity       ServiceAffinity               `json:"sessionAffinity,omitempty"`
	ExternalTrafficPolicy ServiceExternalTrafficPolicy  `json:"externalTrafficPolicy,omitempty"`
	HealthCheckNodePort   int32                         `json:"healthCheckNodePort,omitempty"`
	SessionAffinityConfig *SessionAffinityConfig        `json:"sessionAffinityConfig,omitempty"`
	InternalTrafficPolicy *ServiceInternalTrafficPolicy `json:"internalTrafficPolicy,omitempty"`
}

// ServicePort is the part of core/v1 ServicePort the load balancer reads.
type ServicePort struct {
	Name     string   `json:"name,omitempty"`
	Protocol Protocol `json:"protocol,omitempty"`
	Port     int32    `json:"port"`
	NodePort int32    `json:"nodePort,omitempty"`
}

// SessionAffinityConfig is core/v1 SessionAffinityConfig.
type SessionAffinityConfig struct {
	ClientIP *ClientIPConfig `json:"clientIP,omitempty"`
}

// ClientIPConfig is core/v1 ClientIPConfig.
type ClientIPConfig struct {
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`
}

// Protocol is core/v1 Protocol.
type Protocol string

const (
	ProtocolTCP  Protocol = "TCP"
	ProtocolUDP  Protocol = "UDP"
	ProtocolSCTP Protocol = "SCTP"
)

// ServiceType is core/v1 ServiceType.
type ServiceType string

const (
	ServiceTypeClusterIP    ServiceType = "ClusterIP"
	ServiceTypeNodePort     ServiceType = "NodePort"
	ServiceTypeLoadBalancer ServiceType = "LoadBalancer"
	ServiceTypeExternalName ServiceType = "ExternalName"
)

// ClusterIPNone is the ClusterIP of a headless Service.
const ClusterIPNone = "None"

// ServiceAffinity is core/v1 ServiceAffinity.
type ServiceAffinity string

const (
	ServiceAffinityClientIP ServiceAffinity = "ClientIP"
	ServiceAffinityNone     ServiceAffinity = "None"
)

// DefaultClientIPServiceAffinitySeconds is the ClientIP affinity's timeout
// when the Service gives none (core/v1).
const DefaultClientIPServiceAffinitySeconds int32 = 10800

// ServiceExternalTrafficPolicy is core/v1 ServiceExternalTrafficPolicy.
type ServiceExternalTrafficPolicy string

const (
	ServiceExternalTrafficPolicyCluster ServiceExternalTrafficPolicy = "Cluster"
	ServiceExternalTrafficPolicyLocal   ServiceExternalTrafficPolicy = "Local"
)

// ServiceInternalTrafficPolicy is core/v1 ServiceInternalTrafficPolicy.
type ServiceInternalTrafficPolicy string

const (
	ServiceInternalTrafficPolicyCluster ServiceInternalTrafficPolicy = "Cluster"
	ServiceInternalTrafficPolicyLocal   ServiceInternalTrafficPolicy = "Local"
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ServiceList is core/v1 ServiceList.
type ServiceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Service `json:"items"`
}

// discovery.k8s.io/v1

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// EndpointSlice is discovery/v1 EndpointSlice.
type EndpointSlice struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	AddressType       AddressType    `json:"addressType"`
	Endpoints         []Endpoint     `json:"endpoints"`
	Ports             []EndpointPort `json:"ports"`
}

// AddressType is discovery/v1 AddressType.
type AddressType string

const (
	AddressTypeIPv4 AddressType = "IPv4"
	AddressTypeIPv6 AddressType = "IPv6"
	AddressTypeFQDN AddressType = "FQDN"
)

// LabelServiceName is the EndpointSlice label naming its Service.
const LabelServiceName = "kubernetes.io/service-name"

// Endpoint is the part of discovery/v1 Endpoint the load balancer reads.
type Endpoint struct {
	Addresses  []string           `json:"addresses"`
	Conditions EndpointConditions `json:"conditions,omitempty"`
	NodeName   *string            `json:"nodeName,omitempty"`
	Hints      *EndpointHints     `json:"hints,omitempty"`
}

// EndpointConditions is discovery/v1 EndpointConditions.
type EndpointConditions struct {
	Ready       *bool `json:"ready,omitempty"`
	Serving     *bool `json:"serving,omitempty"`
	Terminating *bool `json:"terminating,omitempty"`
}

// EndpointHints is the part of discovery/v1 EndpointHints the load
// balancer reads (zone hints).
type EndpointHints struct {
	ForZones []ForZone `json:"forZones,omitempty"`
}

// ForZone is discovery/v1 ForZone.
type ForZone struct {
	Name string `json:"name"`
}

// EndpointPort is the part of discovery/v1 EndpointPort the load balancer
// reads.
type EndpointPort struct {
	Name     *string   `json:"name,omitempty"`
	Protocol *Protocol `json:"protocol,omitempty"`
	Port     *int32    `json:"port,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// EndpointSliceList is discovery/v1 EndpointSliceList.
type EndpointSliceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EndpointSlice `json:"items"`
}

// apps/v1

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// DaemonSet is apps/v1 DaemonSet (its metadata: removal detection).
type DaemonSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// DaemonSetList is apps/v1 DaemonSetList.
type DaemonSetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DaemonSet `json:"items"`
}
