package bypass

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Pins: everything under the family's directory <pin dir>/bypass (b.pinDir):
// the maps, the tcx links at links/tcx/<netns cookie>/<ifindex>/<program>_<dir>
// and the legacy tc records at tc/<netns cookie>/<ifindex>/<program>_<dir>.
// Every program's name starts with linkPrefix.
const linkPrefix = ProgPrefix

// ProgPrefix starts the name of every program of the bypass.
const ProgPrefix = bypassProgEzBypass

// Migrate moves the links and legacy tc records that builds before the
// family's own directory pinned among the shortcut's (<pin dir>/links/tcx,
// <pin dir>/tc, told apart by linkPrefix) to the family's directory, within
// tx (nil: no rollback).
func Migrate(tx *bpfsys.Tx, pinDir string) error {
	fam := mapDir(pinDir)
	return bpfsys.MovePins(tx, pinDir, func(rel string) string {
		if !strings.HasPrefix(filepath.Base(rel), linkPrefix) || strings.HasPrefix(rel, MapDir+"/") {
			return ""
		}
		return filepath.Join(fam, rel)
	})
}

func dirName(ingress bool) string {
	if ingress {
		return "ingress"
	}
	return "egress"
}

// Legacy tc priorities (kernels without tcx): after ez_close_reset (1) and
// ez_svc_nodeport (2), as tcx appends the bypass after other owners.
const bypassPrio = 3

// attachOne attaches prog at ingress or egress of ifx, after other owners'
// programs. With pins, what an earlier agent pinned or recorded there gets
// prog in place (no moment without the bypass); a defunct tcx link (its
// device went, the ifindex was reused) is replaced. It returns the hook and
// its pin or record ("": unpinned).
func (b *Bypass) attachOne(ifx int, prog *ebpf.Program, ingress bool) (*bpfsys.TCHook, string, error) {
	info, err := prog.Info()
	if err != nil {
		return nil, "", fmt.Errorf("program info: %w", err)
	}
	if !strings.HasPrefix(info.Name, linkPrefix) {
		return nil, "", fmt.Errorf("program %q is not the bypass's", info.Name)
	}
	return bpfsys.AttachTCHook(bpfsys.TCHookOptions{Ifindex: ifx, Ingress: ingress, Program: prog, Name: info.Name,
		Prio: bypassPrio, Dir: b.pinDir, Cookie: b.cookie})
}

// release drops this process's hold on l; with detach it also detaches it
// (unpinned, or its record removed) and removes its empty directories.
func (b *Bypass) release(l *bpfsys.TCHook, detach bool) error {
	if !detach {
		return l.Close()
	}
	return l.Detach()
}

// removeEmpty removes the ifindex and netns directories of pin once empty.
func removeEmpty(pin string) {
	os.Remove(filepath.Dir(pin))
	os.Remove(filepath.Dir(filepath.Dir(pin)))
}

// Prune unpins the bypass links pinned in this netns that this Bypass has
// not attached or adopted (devices an earlier agent attached that are gone
// or no longer wanted) and their device entries. Call it after the first
// convergence.
func (b *Bypass) Prune() (pruned []string, err error) {
	if b.pinDir == "" {
		return nil, nil
	}
	mine := map[string]bool{}
	for _, a := range b.links {
		for _, p := range a.pins {
			mine[p] = true
		}
	}
	base := bpfsys.LinkPin(b.pinDir, bpfsys.KindTCX, strconv.FormatUint(b.cookie, 10))
	pins, err := bpfsys.PinnedLinks(b.pinDir)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, pin := range pins {
		if filepath.Dir(filepath.Dir(pin)) != base || !strings.HasPrefix(filepath.Base(pin), linkPrefix) || mine[pin] {
			continue
		}
		if err := bpfsys.UnpinLink(pin); err != nil {
			errs = append(errs, err)
			continue
		}
		removeEmpty(pin)
		pruned = append(pruned, pin)
	}
	recs, err := bpfsys.TCRecords(b.pinDir)
	if err != nil {
		return pruned, err
	}
	for _, rec := range recs {
		c, f, err := bpfsys.ParseTCRecord(rec)
		if err != nil || c != b.cookie || !strings.HasPrefix(f.Name, linkPrefix) || mine[rec] {
			continue
		}
		if err := bpfsys.DetachTCFilter(rec); err != nil {
			errs = append(errs, err)
			continue
		}
		pruned = append(pruned, rec)
	}
	var key uint32
	var stale []uint32
	var dev bypassEzBpDevice
	for it := b.objs.EzBpDevices.Iterate(); it.Next(&key, &dev); {
		if _, ok := b.links[int(key)]; !ok {
			stale = append(stale, key)
		}
	}
	for _, k := range stale {
		if err := b.objs.EzBpDevices.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	return pruned, errors.Join(errs...)
}

// Endpoints reads the endpoints map (with pins, what an earlier agent
// left: the caller converges from there).
func (b *Bypass) Endpoints() (map[netip.Addr]Endpoint, error) {
	out := map[netip.Addr]Endpoint{}
	var k bypassEzBpEpKey
	var v bypassEzBpEndpoint
	it := b.objs.EzBpEndpoints.Iterate()
	for it.Next(&k, &v) {
		out[netip.AddrFrom16(k.Ip).Unmap()] = Endpoint{
			Ifindex:   int(v.Ifindex),
			PodMAC:    net.HardwareAddr(bytes.Clone(v.PodMac[:])),
			BridgeMAC: net.HardwareAddr(bytes.Clone(v.BridgeMac[:])),
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("bypass: read endpoints: %w", err)
	}
	return out, nil
}

// Unpin removes a bypass pinned under pinDir by an earlier agent: its
// links (in every network namespace) are unpinned, so detached, its legacy
// tc filters detached, and its maps unpinned. For an agent told not to run
// the bypass any more, and uninstall.
func Unpin(pinDir string) (links int, err error) {
	if err := Migrate(nil, pinDir); err != nil {
		return 0, err
	}
	fam := mapDir(pinDir)
	pins, err := bpfsys.PinnedLinks(fam)
	if err != nil {
		return 0, err
	}
	for _, pin := range pins {
		if err := bpfsys.UnpinLink(pin); err != nil {
			return links, err
		}
		removeEmpty(pin)
		links++
	}
	recs, err := bpfsys.TCRecords(fam)
	if err != nil {
		return links, err
	}
	for _, rec := range recs {
		if err := bpfsys.DetachTCFilter(rec); err != nil {
			return links, err
		}
		links++
	}
	if err := os.RemoveAll(fam); err != nil && !errors.Is(err, unix.ENOENT) {
		return links, fmt.Errorf("bypass: remove %s: %w", fam, err)
	}
	return links, nil
}

// PinnedState is what `eztunnel status` shows of a pinned bypass.
type PinnedState struct {
	PodVeths  int      `json:"pod_veths"`
	Uplinks   int      `json:"uplinks"`
	Endpoints int      `json:"endpoints"`
	Counters  Counters `json:"counters"`
}

// ReadPinned reads the bypass pinned under pinDir; nil and no error when
// there is none.
func ReadPinned(pinDir string) (*PinnedState, error) {
	dir := mapDir(pinDir)
	if !bpfsys.Exists(dir) {
		return nil, nil
	}
	open := func(name string) (*ebpf.Map, error) {
		m, err := bpfsys.OpenPinnedMap(dir, name)
		if err != nil {
			return nil, fmt.Errorf("bypass: %w", err)
		}
		return m, nil
	}
	st := &PinnedState{Counters: Counters{}}
	devs, err := open(bypassMapEzBpDevices)
	if err != nil {
		return nil, err
	}
	defer devs.Close()
	var ifx uint32
	var dev bypassEzBpDevice
	it := devs.Iterate()
	for it.Next(&ifx, &dev) {
		if dev.Kind == uint32(bypassEzBpDevKindEZ_BP_DEV_UPLINK) {
			st.Uplinks++
		} else {
			st.PodVeths++
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("bypass: read devices: %w", err)
	}
	eps, err := open(bypassMapEzBpEndpoints)
	if err != nil {
		return nil, err
	}
	defer eps.Close()
	var k bypassEzBpEpKey
	var v bypassEzBpEndpoint
	for it := eps.Iterate(); it.Next(&k, &v); {
		st.Endpoints++
	}
	ctrs, err := open(bypassMapEzBpCounters)
	if err != nil {
		return nil, err
	}
	defer ctrs.Close()
	if err := counters.ReadInto(ctrs, st.Counters); err != nil {
		return nil, fmt.Errorf("bypass: %w", err)
	}
	return st, nil
}
