package shortcut

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Connection is one end of an accelerated connection, as the ez_sc_conns
// iterator reports it (struct ez_conn_record).
type Connection struct {
	Cookie      uint64         `json:"cookie"`
	PeerCookie  uint64         `json:"peer_cookie"`
	Role        string         `json:"role"` // "client" or "server"
	Client      netip.AddrPort `json:"client"`
	Server      netip.AddrPort `json:"server"`
	NetnsCookie uint64         `json:"netns_cookie"`
	NetnsInode  uint32         `json:"netns_inode"`
	TxMsgs      uint64         `json:"tx_msgs"`  // messages this end redirected to its peer
	TxBytes     uint64         `json:"tx_bytes"` // bytes this end redirected to its peer
	// RxUnread is what was redirected to this end and not read yet (the
	// client's row is the server-to-client direction); RxBound its bound.
	RxUnread int64  `json:"rx_unread"`
	RxBound  uint32 `json:"rx_bound"`
	// Switched: the receiver fell RxBound behind in one direction and the
	// connection moved to the kernel path for good; Left: this end has left
	// the sockhash since (nothing redirected to it was unread).
	Switched bool `json:"switched"`
	Left     bool `json:"left"`
	// Adopted: paired by adoption (established before the agent), not at its handshake.
	Adopted bool `json:"adopted,omitempty"`
}

// Connections lists the accelerated sockets of the datapath pinned under
// dir: a fresh copy of the ez_sc_conns iterator (iter/tcp) is loaded against the
// pinned maps and run in every network namespace of the node
// (bpfsys.NetNamespaces), so it works without a running agent.
func Connections(dir string) ([]Connection, error) {
	if !bpfsys.Exists(dir) {
		return nil, fmt.Errorf("%w at %s", ErrNotInstalled, dir)
	}
	socks, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScSocks), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned map ez_sc_socks: %w", err)
	}
	defer socks.Close()
	unreads, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScUnreads), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned map ez_sc_unreads: %w", err)
	}
	defer unreads.Close()

	spec, err := loadShortcut()
	if err != nil {
		return nil, fmt.Errorf("datapath: parse embedded object: %w", err)
	}
	// Only the iterator is loaded, against the pinned maps it reads.
	var objs struct {
		EzScConns *ebpf.Program `ebpf:"ez_sc_conns"`
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{shortcutMapEzScSocks: socks, shortcutMapEzScUnreads: unreads}}
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("datapath: verifier rejected ez_sc_conns (connection listing): %+v", verr)
		}
		return nil, fmt.Errorf("datapath: load ez_sc_conns (connection listing): %w", err)
	}
	defer objs.EzScConns.Close()
	it, err := link.AttachIter(link.IterOptions{Program: objs.EzScConns})
	if err != nil {
		return nil, fmt.Errorf("attach connections iterator: %w", err)
	}
	defer it.Close()
	namespaces, err := bpfsys.NetNamespaces()
	if err != nil {
		return nil, fmt.Errorf("list network namespaces: %w", err)
	}
	seen := map[uint64]bool{}
	var conns []Connection
	denied := 0
	for _, ns := range namespaces {
		err := runIn(it, ns, func(r io.Reader) error {
			cs, err := readConnections(bufio.NewReader(r))
			for _, c := range cs {
				if !seen[c.Cookie] {
					seen[c.Cookie] = true
					conns = append(conns, c)
				}
			}
			return err
		})
		if errors.Is(err, os.ErrPermission) {
			denied++
			continue
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("connections in %s: %w", ns, err)
		}
	}
	if denied > 0 {
		// setns needs CAP_SYS_ADMIN (the chart's adoption.enabled grants it).
		slog.Warn("connections: some network namespaces could not be entered; their connections are not listed", "namespaces", denied)
	}
	// The two ends of a connection next to each other, client first.
	slices.SortFunc(conns, func(a, b Connection) int {
		return cmp.Or(a.Client.Compare(b.Client), a.Server.Compare(b.Server), cmp.Compare(a.Role, b.Role))
	})
	return conns, nil
}

// readConnections decodes fixed-width struct ez_conn_record until EOF.
func readConnections(r io.Reader) ([]Connection, error) {
	var out []Connection
	err := readRecords(r, func(rec *shortcutEzConnRecord) { out = append(out, connectionOf(rec)) })
	if err != nil {
		return nil, fmt.Errorf("read connection record: %w", err)
	}
	return out, nil
}

// readRecords decodes the fixed-width records an iterator writes
// (bpf_seq_write) until EOF and hands each to add.
func readRecords[T any](r io.Reader, add func(*T)) error {
	for {
		var rec T
		err := binary.Read(r, binary.LittleEndian, &rec)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		add(&rec)
	}
}

func connectionOf(rec *shortcutEzConnRecord) Connection {
	role := "server"
	if rec.Flags&uint32(shortcutEzSockFlagsEZ_F_CLIENT) != 0 {
		role = "client"
	}
	return Connection{
		Cookie:      rec.Cookie,
		PeerCookie:  rec.PeerCookie,
		Role:        role,
		Client:      netip.AddrPortFrom(netip.AddrFrom16(rec.Key.ClientIp).Unmap(), rec.Key.ClientPort),
		Server:      netip.AddrPortFrom(netip.AddrFrom16(rec.Key.ServerIp).Unmap(), rec.Key.ServerPort),
		NetnsCookie: rec.NetnsCookie,
		NetnsInode:  rec.NetnsIno,
		TxMsgs:      rec.TxMsgs,
		TxBytes:     rec.TxBytes,
		RxUnread:    rec.RxUnread,
		RxBound:     rec.RxBound,
		Switched:    rec.Switched != 0,
		Left:        rec.State == uint32(shortcutEzSockStateEZ_SOCK_LEFT),
		Adopted:     rec.Flags&uint32(shortcutEzSockFlagsEZ_F_ADOPTED) != 0,
	}
}
