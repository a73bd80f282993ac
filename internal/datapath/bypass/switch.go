package bypass

import (
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Switch is the switch of a pinned bypass (struct ez_bp_ctl in
// bpf/bypass/bypass.h): paused, the programs stay attached, the admissions
// go on being recorded, and every packet takes the kernel path, counted as
// fallback_paused. A load of the bypass starts unpaused. It lets a
// benchmark compare the two paths on the same established flows
// (`eztunnel-lab bench bypass --paired`).
type Switch struct{ m *ebpf.Map }

// OpenSwitch opens the switch of the bypass pinned in the datapath pin
// directory pinDir.
func OpenSwitch(pinDir string) (*Switch, error) {
	path := filepath.Join(mapDir(pinDir), bypassMapEzBpSwitch)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("bypass switch %s: %w", path, err)
	}
	return &Switch{m: m}, nil
}

// Pause pauses (true) or resumes (false) the bypass.
func (s *Switch) Pause(paused bool) error {
	var v bypassEzBpCtl
	if paused {
		v.Paused = 1
	}
	return s.m.Update(uint32(0), v, ebpf.UpdateAny)
}

// Close releases the map (the switch keeps its position).
func (s *Switch) Close() error { return s.m.Close() }
