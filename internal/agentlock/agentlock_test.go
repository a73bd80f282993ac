package agentlock

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSecondAgentRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.lock")
	a, err := Acquire(path, "agent-a", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	_, err = Acquire(path, "agent-b", false, time.Second)
	if err == nil || !strings.Contains(err.Error(), "agent-a") || !strings.Contains(err.Error(), "--takeover") {
		t.Fatalf("second agent: %v, want a refusal naming agent-a and --takeover", err)
	}
}

func TestTakeoverHandsOver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.lock")
	a, err := Acquire(path, "agent-a", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		who := <-a.Requested()
		if who != "agent-b" {
			t.Errorf("request from %q, want agent-b", who)
		}
		a.Release()
	}()
	b, err := Acquire(path, "agent-b", true, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if _, err := os.Stat(RequestPath(path)); !os.IsNotExist(err) {
		t.Fatalf("takeover request left behind: %v", err)
	}
	if got, _ := os.ReadFile(path); !strings.HasPrefix(string(got), "agent-b\npid ") || !strings.Contains(string(got), "took over from agent-a") {
		t.Fatalf("lock file says %q, want agent-b as holder", got)
	}
	select {
	case who := <-b.Requested():
		t.Fatalf("new holder saw a takeover request from %q", who)
	case <-time.After(3 * poll):
	}
}

func TestTakeoverTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.lock")
	a, err := Acquire(path, "agent-a", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	_, err = Acquire(path, "agent-b", true, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not hand over") {
		t.Fatalf("takeover of a holder that never releases: %v", err)
	}
	if _, err := os.Stat(RequestPath(path)); !os.IsNotExist(err) {
		t.Fatalf("request of a waiter that gave up left behind: %v", err)
	}
}

func TestRelativePathRefused(t *testing.T) {
	if _, err := Acquire("agent.lock", "x", false, time.Second); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Fatalf("relative path: %v", err)
	}
}

func TestRemoveThenAcquire(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "agent.lock")
	a, err := Acquire(path, "agent-a", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("lock file still there after Remove: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(path)); !os.IsNotExist(err) {
		t.Fatalf("empty lock directory still there after Remove: %v", err)
	}
	b, err := Acquire(path, "agent-b", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b.Release()
}

// A restarted container of the pod being replaced must not ask for the
// datapath back: whoever the holder took over from is refused.
func TestSupersededDoesNotTakeBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.lock")
	a, err := Acquire(path, "pod ns/old", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	go func() { <-a.Requested(); a.Release() }()
	b, err := Acquire(path, "pod ns/new", true, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if _, err := Acquire(path, "pod ns/old", true, time.Second); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("the replaced pod asking again: %v, want ErrSuperseded", err)
	}
	if _, err := os.Stat(RequestPath(path)); !os.IsNotExist(err) {
		t.Fatalf("a superseded agent left a takeover request: %v", err)
	}
	go func() { <-b.Requested(); b.Release() }()
	c, err := Acquire(path, "pod ns/newer", true, 5*time.Second)
	if err != nil {
		t.Fatalf("the next update: %v", err)
	}
	c.Release()
}

func TestHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.lock")
	if _, err := Holder(path); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("no lock file: %v, want ErrNoAgent", err)
	}
	a, err := Acquire(path, "pod ns/agent-a", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := Holder(path); err != nil || h != "pod ns/agent-a" {
		t.Fatalf("held: %q, %v", h, err)
	}
	a.Release()
	// The file stays, naming the agent that stopped: nobody holds it.
	if h, err := Holder(path); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("released: %q, %v, want ErrNoAgent", h, err)
	}
}
