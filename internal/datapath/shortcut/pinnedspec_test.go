package shortcut

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

// TestReleaseAgainstResizedMaps: ez_sc_release (what uninstall runs) loads
// against a sockhash and counters sized as `eztunnel run --max-sockets`
// sized them, not as the object declares; it failed with "MaxEntries:
// 204096 changed to 131072: map spec is incompatible with existing map".
func TestReleaseAgainstResizedMaps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("loading eBPF programs needs root: run go test as root")
	}
	spec, err := loadShortcut()
	if err != nil {
		t.Fatal(err)
	}
	sockSpec := spec.Maps[shortcutMapEzScSockets].Copy()
	sockSpec.MaxEntries = sockSpec.MaxEntries*2 + 4096
	sockSpec.Pinning = ebpf.PinNone
	sockets, err := ebpf.NewMap(sockSpec)
	if err != nil {
		t.Fatal(err)
	}
	defer sockets.Close()
	ctrSpec := spec.Maps[shortcutMapEzScCounters].Copy()
	ctrSpec.Pinning = ebpf.PinNone
	counters, err := ebpf.NewMap(ctrSpec)
	if err != nil {
		t.Fatal(err)
	}
	defer counters.Close()
	prog, err := loadRelease(sockets, counters)
	if err != nil {
		t.Fatal(err)
	}
	prog.Close()

	resized, _ := againstPinned(spec, map[string]*ebpf.Map{shortcutMapEzScSockets: sockets})
	if got := resized.Maps[shortcutMapEzScSockets].MaxEntries; got != sockSpec.MaxEntries {
		t.Errorf("resized spec: MaxEntries %d, want %d", got, sockSpec.MaxEntries)
	}
	if spec.Maps[shortcutMapEzScSockets].MaxEntries == sockSpec.MaxEntries {
		t.Error("againstPinned changed the spec it was given")
	}
}
