package workload

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestServeHTTPPhases: against a real HTTP server on loopback, "keep"
// phases reuse one connection, "fresh" ones open another, each phase
// answers with its responses and their median; a malformed request line
// ends the run with an error, a status other than 200 is the phase's error.
func TestServeHTTPPhases(t *testing.T) {
	page := strings.Repeat("x", 612)
	var mu sync.Mutex
	conns := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conns[r.RemoteAddr] = true
		mu.Unlock()
		if r.URL.Path != "/index.html" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(page))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	in := strings.Join([]string{"keep " + addr + " 20ms", "keep " + addr + " 20ms", "fresh " + addr + " 20ms"}, "\n") + "\n"
	var out bytes.Buffer
	if err := ServeHTTPPhases(strings.NewReader(in), &out, "index.html"); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&out)
	for i := range 3 {
		var ph HTTPPhase
		if err := dec.Decode(&ph); err != nil {
			t.Fatalf("phase %d: %v", i, err)
		}
		if ph.Err != "" || ph.N < 1 || ph.MedianUs <= 0 || ph.MedianUs > float64(time.Second.Microseconds()) {
			t.Fatalf("phase %d: %+v", i, ph)
		}
	}
	mu.Lock()
	n := len(conns)
	mu.Unlock()
	if n != 2 {
		t.Errorf("%d connections for keep, keep, fresh: want 2", n)
	}
	out.Reset()
	if err := ServeHTTPPhases(strings.NewReader("keep "+addr+" 20ms\n"), &out, "missing.html"); err != nil {
		t.Fatal(err)
	}
	var ph HTTPPhase
	if err := json.Unmarshal(out.Bytes(), &ph); err != nil || !strings.Contains(ph.Err, "404") {
		t.Errorf("a 404: %q (%v), want the phase's error", out.String(), err)
	}
	if err := ServeHTTPPhases(strings.NewReader("again "+addr+"\n"), &out, "index.html"); err == nil {
		t.Error("a malformed request line accepted")
	}
}
