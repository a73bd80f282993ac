package shortcut

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
)

// releasePass runs prog (ez_sc_release or ez_sc_release_switched, tc programs that
// never see traffic: bpf/shortcut/release.h) once for every socket in the
// sockhash, through BPF_PROG_TEST_RUN with the socket's cookie in the input
// packet, and counts what they answered.
func releasePass(prog *ebpf.Program, sockets *ebpf.Map) (released, waiting int, err error) {
	cookies, err := sockhashCookies(sockets)
	if err != nil {
		return 0, 0, fmt.Errorf("list enrolled sockets: %w", err)
	}
	in := make([]byte, shortcutEzReleaseInputEZ_RELEASE_INPUT_LEN)
	for _, c := range cookies {
		binary.NativeEndian.PutUint64(in[shortcutEzReleaseInputEZ_RELEASE_COOKIE_OFF:], c)
		ret, err := prog.Run(&ebpf.RunOptions{Data: in})
		if err != nil {
			return released, waiting, fmt.Errorf("run %s: %w", progName(prog), err)
		}
		switch shortcutEzReleaseResult(ret) {
		case shortcutEzReleaseResultEZ_REL_RELEASED:
			released++
		case shortcutEzReleaseResultEZ_REL_WAIT:
			waiting++
		}
	}
	return released, waiting, nil
}

// sockhashCookies lists the keys (socket cookies) of a sockhash. A socket
// that closes meanwhile may be missing or listed: the programs look each up.
func sockhashCookies(m *ebpf.Map) ([]uint64, error) {
	var out []uint64
	var key, val uint64 // a sockhash value reads back as the socket's cookie
	it := m.Iterate()
	for it.Next(&key, &val) {
		out = append(out, key)
	}
	return out, it.Err()
}

func progName(p *ebpf.Program) string {
	if info, err := p.Info(); err == nil && info.Name != "" {
		return info.Name
	}
	return "release program"
}
