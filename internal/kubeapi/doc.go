// Package kubeapi holds the Kubernetes API objects the agent reads, with
// only the fields it reads: Pod, Namespace, Node (core/v1), Service (core/v1),
// EndpointSlice (discovery.k8s.io/v1) and DaemonSet (apps/v1), and their
// lists. The names of types, fields and JSON keys are the upstream ones
// (k8s.io/api), so code reads as it would with those; a test walks every
// field against the upstream type.
//
// The upstream packages are not linked: k8s.io/api/core/v1 alone, with its
// generated protobuf and conversion code, is about 4 MB of the agent binary.
// The objects are decoded from the API server's JSON (JSON ignores the
// fields not declared here); Scheme registers them under their upstream
// group, version and kind for client-go's REST client and informers.
// The price: JSON decodes slower than protobuf did into k8s.io/api's types,
// with half the memory. BenchmarkDecodeLists, one CPU, a list of 10,000
// Services: 231 ms and 29.6 MB here, against 87 ms and 60.8 MB; as much
// again for their EndpointSlices. Once per (re)list; watch events are one
// object each.
//
// +k8s:deepcopy-gen=package
package kubeapi

//go:generate go tool deepcopy-gen --output-file zz_generated.deepcopy.go --go-header-file /dev/null .
