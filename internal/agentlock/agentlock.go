// Package agentlock keeps one agent per node. The agent holds an exclusive
// flock on a lock file (a hostPath shared by every agent pod of the node)
// for as long as it manages the datapath. A second agent either refuses, or,
// asked to take over (a DaemonSet update with maxSurge runs the new agent
// before the old one stops), writes a takeover request next to the lock and
// waits: the holder sees the request, stops managing, releases the lock and
// stays up on standby until it is stopped. `eztunnel uninstall` takes over
// the same way, so a running agent does not put back what it removes.
package agentlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
)

// poll is how often a waiting agent retries the lock and a holder looks for
// a takeover request.
const poll = 100 * time.Millisecond

// Lock is a held agent lock.
type Lock struct {
	path string
	f    *os.File
	done chan struct{}
	req  chan string
}

// RequestPath is where a takeover request for the lock at path is written.
func RequestPath(path string) string { return path + ".takeover" }

// Acquire takes the lock at path for who (written into the lock file, shown
// to whoever finds it held). If another process holds it: without takeover
// it fails naming the holder; with takeover it asks the holder to hand over
// and waits up to wait.
func Acquire(path, who string, takeover bool, wait time.Duration) (*Lock, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("lock file %q must be an absolute path", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock file directory: %w", err)
	}
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if errors.Is(err, os.ErrNotExist) {
			// Remove took the directory away meanwhile: make it again.
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return nil, fmt.Errorf("lock file directory: %w", err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open lock file: %w", err)
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		var from string
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder, supersededBy := readHolder(path), tookOverFrom(path)
			if takeover && supersededBy == who {
				f.Close()
				return nil, fmt.Errorf("%w: %s took over from %s; not asking for the datapath back", ErrSuperseded, holder, who)
			}
			from = holder
			if !takeover {
				f.Close()
				return nil, fmt.Errorf("another eztunnel agent manages this datapath (lock %s held by %s); stop it, or pass --takeover to ask it to hand over", path, holder)
			}
			err = waitHandover(f, path, who, holder, wait)
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		// Remove (uninstall) may have unlinked the file we locked: the lock
		// is only ours if the path still names it.
		if !samePath(f, path) {
			f.Close()
			continue
		}
		// Ours now: a request left by a waiter that gave up is stale.
		os.Remove(RequestPath(path))
		if err := f.Truncate(0); err == nil {
			rec := fmt.Sprintf("%s\npid %d since %s\n", who, os.Getpid(), time.Now().UTC().Format(time.RFC3339))
			if Version != "" {
				rec += versionPrefix + Version + "\n"
			}
			if Signals != "" {
				rec += signalsPrefix + Signals + "\n"
			}
			if from != "" {
				rec += tookOverPrefix + from + "\n"
			}
			f.WriteAt([]byte(rec), 0)
		}
		l := &Lock{path: path, f: f, done: make(chan struct{}), req: make(chan string, 1)}
		go l.watch()
		return l, nil
	}
}

func samePath(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

func waitHandover(f *os.File, path, who, holder string, wait time.Duration) error {
	req := RequestPath(path)
	if err := os.WriteFile(req, []byte(who+"\n"), 0o644); err != nil {
		return fmt.Errorf("write takeover request: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("lock %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			os.Remove(req)
			return fmt.Errorf("the agent holding %s (%s) did not hand over within %s", path, holder, wait)
		}
		time.Sleep(poll)
	}
}

// ErrSuperseded: the agent asking for the lock is the one the holder took
// it over from (a restarted container of the pod being replaced).
var ErrSuperseded = errors.New("superseded")

const tookOverPrefix = "took over from "

// readHolder is the lock file's first line: who holds it.
func readHolder(path string) string {
	b, _ := os.ReadFile(path)
	return holderOf(b)
}

// holderOf is a lock record's first line: who holds it.
func holderOf(rec []byte) string {
	first, _, _ := strings.Cut(string(rec), "\n")
	if strings.TrimSpace(first) == "" {
		return "an unknown process"
	}
	return strings.TrimSpace(first)
}

// field is the rest of a lock record's line that starts with prefix, "" if
// none does.
func field(rec []byte, prefix string) string {
	for _, line := range strings.Split(string(rec), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return v
		}
	}
	return ""
}

// tookOverFrom is whom the holder took the lock over from, if anyone.
func tookOverFrom(path string) string {
	b, _ := os.ReadFile(path)
	return field(b, tookOverPrefix)
}

// watchPoll is how often the holder also looks for a request while inotify
// watches the lock's directory (a backstop; without inotify it looks every
// poll).
const watchPoll = 5 * time.Second

// watch reports the first takeover request on Requested. inotify on the
// lock's directory says when the request file is written, so an idle
// holder does not wake up to look for it (it did ten times a second).
func (l *Lock) watch() {
	req := filepath.Clean(RequestPath(l.path))
	every := poll
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w, err := fsnotify.NewWatcher(); err == nil {
		defer w.Close()
		if w.Add(filepath.Dir(l.path)) == nil {
			events, errs, every = w.Events, w.Errors, watchPoll
		}
	}
	// found reports the request if there is one. A file just created
	// does not hold its writer's name yet: it counts once the name is
	// written (its write event, or the backstop; a waiter that died before
	// writing is replaced by the next one's request).
	found := func() bool {
		b, err := os.ReadFile(req)
		who := strings.TrimSpace(string(b))
		if err != nil || who == "" {
			return false
		}
		l.req <- who
		return true
	}
	if found() {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case ev, ok := <-events:
			if !ok {
				events, errs = nil, nil
				t.Reset(poll)
				continue
			}
			if filepath.Clean(ev.Name) == req && ev.Has(fsnotify.Create|fsnotify.Write) && found() {
				return
			}
		case <-errs: // overflow: the backstop looks
		case <-t.C:
			if found() {
				return
			}
		}
	}
}

// Requested delivers who asked to take over, once.
func (l *Lock) Requested() <-chan string { return l.req }

// Remove deletes the lock file while holding it (after uninstall: nothing
// is left to manage), then releases it, and removes its directory if empty.
func (l *Lock) Remove() error {
	os.Remove(RequestPath(l.path))
	err := os.Remove(l.path)
	if rerr := l.Release(); err == nil {
		err = rerr
	}
	os.Remove(filepath.Dir(l.path)) // only if no other lock lives there
	return err
}

// Release lets the lock go (the next agent may take it).
func (l *Lock) Release() error {
	select {
	case <-l.done:
		return nil
	default:
	}
	close(l.done)
	return l.f.Close() // closing the last descriptor drops the flock
}

// Owner names this process in the lock file: the pod in Kubernetes (from
// the POD_NAME and POD_NAMESPACE the chart sets), else the host and pid.
func Owner() string {
	if pod := os.Getenv("POD_NAME"); pod != "" {
		return "pod " + os.Getenv("POD_NAMESPACE") + "/" + pod
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("eztunnel run (pid %d) on %s", os.Getpid(), host)
}

// Holder is who holds the lock at path (the first line of the file), or
// ErrNoAgent when the lock is free.
func Holder(path string) (string, error) {
	if err := held(path); err != nil {
		return "", err
	}
	return readHolder(path), nil
}

// held is nil when a process holds the lock at path, else ErrNoAgent (or
// the error opening it).
func held(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w %s", ErrNoAgent, path)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err == nil {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return fmt.Errorf("%w %s", ErrNoAgent, path)
	}
	return nil
}

// Version is this binary's version, written into the lock file it takes
// (`eztunnel version` reads the running agent's from there). Set by main.
var Version string

const versionPrefix = "version "

// Signals names the signals this process takes as requests (the agent:
// SIGUSR1 adoption, SIGUSR2 log level), written into the lock it takes so a
// command signals only a holder that takes them (the default action of
// SIGUSR2 ends a process). Set by the agent before it takes the lock.
var Signals string

const signalsPrefix = "signals "

// Record is what the holder of a lock wrote into it.
type Record struct {
	Holder  string // who (the first line)
	PID     int    // 0: none written
	Version string // "": an agent older than the field
	Signals string // "": none (or an agent older than the field)
}

// HolderRecord reads the record of the process holding the lock at path,
// checked and read once; ErrNoAgent when the lock is free.
func HolderRecord(path string) (Record, error) {
	if err := held(path); err != nil {
		return Record{}, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Record{}, err
	}
	r := Record{Holder: holderOf(b), Version: field(b, versionPrefix), Signals: field(b, signalsPrefix)}
	pid, _, _ := strings.Cut(field(b, "pid "), " ")
	if n, err := strconv.Atoi(pid); err == nil && n > 0 {
		r.PID = n
	}
	return r, nil
}

// ErrNoAgent: nobody holds the lock.
var ErrNoAgent = errors.New("no agent holds the lock")

// HolderPID is the process id of the agent holding the lock at path, or
// ErrNoAgent when the lock is free (the file of an agent that stopped).
func HolderPID(path string) (int, error) {
	r, err := HolderRecord(path)
	if err != nil {
		return 0, err
	}
	if r.PID == 0 {
		return 0, fmt.Errorf("lock file %s names no pid", path)
	}
	return r.PID, nil
}
