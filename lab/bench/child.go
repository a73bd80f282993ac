package bench

import (
	"context"
	"os/exec"
	"time"
)

// WaitOrKill waits up to 5 s for a bench's child cmd (started with a
// context cancel cancels) to exit after its input closed, then cancels it.
func WaitOrKill(cmd *exec.Cmd, cancel context.CancelFunc) {
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		cancel()
		<-done
	}
	cancel()
}
