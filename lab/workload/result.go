package workload

import "github.com/eztunnel/eztunnel/internal/stats"

// PingPongResult is what `workload pingpong` prints.
type PingPongResult struct {
	Size    int           `json:"size"`
	Micros  stats.Summary `json:"rtt_us"`
	Samples []float64     `json:"samples_us,omitempty"`
	// SpuriousEAGAIN counts EAGAINs the blocking reads had to retry (see
	// SpuriousEAGAIN); always 0 on plain TCP.
	SpuriousEAGAIN int64 `json:"spurious_eagain"`
	// CPUSeconds: with --phases, the client's user+system CPU time from
	// its dial to its close (getrusage): the phase's own, without the
	// process's start.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
}

// UDPResult is what `workload udp --addr` prints.
type UDPResult struct {
	Sent   int           `json:"sent"`
	Echoed int           `json:"echoed"`
	Micros stats.Summary `json:"rtt_us"` // of the echoed datagrams
}

// StreamReport is what `workload stream` prints.
type StreamReport struct {
	Conns    int            `json:"conns"`
	Failures []StreamResult `json:"failures"`
	Seconds  float64        `json:"seconds"` // wall time of all connections
}
