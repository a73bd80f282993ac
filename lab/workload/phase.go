package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/eztunnel/eztunnel/internal/stats"
)

// Phase is one timed phase of a phase client (`workload echo-phases`,
// `workload http-phases`): the median of its operations' times and how many
// were timed, or what failed.
type Phase struct {
	MedianUs float64 `json:"median_us"`
	N        int     `json:"n"`
	// SpuriousEAGAIN counts the EAGAINs its blocking reads retried (the
	// sockmap receive path's; plain TCP gives none).
	SpuriousEAGAIN int64  `json:"spurious_eagain,omitempty"`
	Err            string `json:"err,omitempty"`
}

// EchoPhase is a phase of back-to-back ping-echo round trips.
type EchoPhase = Phase

// HTTPPhase is a phase of HTTP requests (response times).
type HTTPPhase = Phase

// timedPhase runs op back to back for d and summarises its times; what
// names one operation in the error of a phase that timed none.
func timedPhase(d time.Duration, what string, op func() (time.Duration, error)) (Phase, error) {
	var us []float64
	eagain := SpuriousEAGAIN.Load()
	for end := time.Now().Add(d); time.Now().Before(end); {
		x, err := op()
		if err != nil {
			return Phase{}, err
		}
		us = append(us, float64(x.Nanoseconds())/1e3)
	}
	if len(us) == 0 {
		return Phase{}, fmt.Errorf("a phase without a single %s", what)
	}
	slices.Sort(us)
	return Phase{MedianUs: stats.Quantile(us, 0.5), N: len(us), SpuriousEAGAIN: SpuriousEAGAIN.Load() - eagain}, nil
}

// AskPhase sends a phase client the request line req on in and reads its
// answer from out; name is the client's command and stderr what it printed
// there, both for the errors.
func AskPhase(in io.Writer, out *bufio.Reader, name, req string, stderr fmt.Stringer) (Phase, error) {
	var r Phase
	if _, err := fmt.Fprintf(in, "%s\n", req); err != nil {
		return r, fmt.Errorf("%s: %w: %s", name, err, stderr)
	}
	line, err := out.ReadBytes('\n')
	if err != nil {
		return r, fmt.Errorf("%s: %w: %s", name, err, stderr)
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("%s printed %q: %w", name, line, err)
	}
	if r.Err != "" {
		return r, fmt.Errorf("%s %s: %s", name, req, r.Err)
	}
	return r, nil
}
