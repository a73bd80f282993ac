package bpfsys

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Tx makes an install over pinned state transactional: every change
// registers how to undo it, and replacements of pinned state wait for
// Commit. Rollback leaves the pinned links with the programs they had and
// nothing new pinned. Links the Tx pins stay owned (and closed) by the caller.
type Tx struct {
	// Fault, when set, is called after every change with its description; an
	// error aborts the install there (tests force failures with it).
	Fault func(change string) error

	undo, commit, done []func() error
}

// Changed reports a change to Fault.
func (tx *Tx) Changed(change string) error {
	if tx.Fault == nil {
		return nil
	}
	return tx.Fault(change)
}

// OnRollback registers an undo step; they run in reverse order.
func (tx *Tx) OnRollback(f func() error) { tx.undo = append(tx.undo, f) }

// OnCommit registers a step run by Commit, in order.
func (tx *Tx) OnCommit(f func() error) { tx.commit = append(tx.commit, f) }

// OnDone registers a release run after Commit or Rollback.
func (tx *Tx) OnDone(f func() error) { tx.done = append(tx.done, f) }

// RunTx runs fn in a new transaction: commits it when fn succeeds, rolls it
// back when fn fails (the rollback's own failure joins fn's error).
func RunTx(fn func(tx *Tx) error) error {
	tx := &Tx{}
	if err := fn(tx); err != nil {
		if rerr := tx.Rollback(); rerr != nil {
			err = fmt.Errorf("%w (and rollback failed: %v)", err, rerr)
		}
		return err
	}
	return tx.Commit()
}

// Rollback undoes every change, newest first, and joins the errors.
func (tx *Tx) Rollback() error {
	var errs []error
	for i := len(tx.undo) - 1; i >= 0; i-- {
		errs = append(errs, tx.undo[i]())
	}
	return errors.Join(append(errs, tx.finish())...)
}

// Commit runs the deferred replacements. They cannot be undone.
func (tx *Tx) Commit() error {
	var errs []error
	for _, f := range tx.commit {
		errs = append(errs, f())
	}
	return errors.Join(append(errs, tx.finish())...)
}

func (tx *Tx) finish() error {
	var errs []error
	for _, f := range tx.done {
		errs = append(errs, f())
	}
	tx.undo, tx.commit, tx.done = nil, nil, nil
	return errors.Join(errs...)
}

// UpdatePinned points the link pinned at pin to prog in place (no gap); on
// rollback it gets its previous program back. It returns false, and no
// error, when nothing is pinned there. prev is the program the link runs now
// if the caller has it pinned; nil: it is found by id, which needs
// CAP_SYS_ADMIN (BPF_PROG_GET_FD_BY_ID).
func (tx *Tx) UpdatePinned(pin string, prog, prev *ebpf.Program) (link.Link, bool, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	info, err := l.Info()
	if err != nil {
		l.Close()
		return nil, false, fmt.Errorf("link info of %s: %w", pin, err)
	}
	// Hold the old program: once the link lets go of it, this fd keeps it.
	var old *ebpf.Program
	if prev != nil {
		if pi, err := prev.Info(); err == nil {
			if id, ok := pi.ID(); ok && id == info.Program {
				if old, err = prev.Clone(); err != nil {
					l.Close()
					return nil, false, fmt.Errorf("hold program %d of %s: %w", info.Program, pin, err)
				}
			}
		}
	}
	if old == nil {
		if old, err = ebpf.NewProgramFromID(info.Program); err != nil {
			l.Close()
			return nil, false, fmt.Errorf("program %d of pinned link %s: %w", info.Program, pin, err)
		}
	}
	tx.OnDone(old.Close)
	if err := l.Update(prog); err != nil {
		l.Close()
		return nil, false, fmt.Errorf("update pinned link %s: %w", pin, err)
	}
	tx.OnRollback(func() error {
		if err := l.Update(old); err != nil {
			return fmt.Errorf("restore program %d of %s: %w", info.Program, pin, err)
		}
		return nil
	})
	return l, true, tx.Changed("update " + pin)
}

// PinLink pins a new link at pin, creating its directories; on rollback it
// is unpinned and the directories it created are removed.
func (tx *Tx) PinLink(l link.Link, pin string) error {
	var made []string
	for d := filepath.Dir(pin); !Exists(d); d = filepath.Dir(d) {
		made = append(made, d)
	}
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		return err
	}
	tx.OnRollback(func() error {
		for _, d := range made {
			os.Remove(d)
		}
		return nil
	})
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	tx.OnRollback(l.Unpin)
	return tx.Changed("pin " + pin)
}
