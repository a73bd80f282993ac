package shortcut

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"time"

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
	// CgroupID is the socket's cgroup v2 id; in Kubernetes mode the agent
	// names the pod it belongs to (Pod: namespace/name; "" where the
	// listing did not come from an agent or the cgroup is no selected pod's).
	CgroupID uint64 `json:"cgroup_id"`
	Pod      string `json:"pod,omitempty"`
	// Indexed: listed from the connection index (ez_sc_index), not by an
	// iterator: TxMsgs, TxBytes and Left are not known (zero).
	Indexed bool `json:"indexed,omitempty"`
}

// Listing is a connection listing and how it was made.
type Listing struct {
	Conns []Connection `json:"connections"`
	// Via is how the sockets were found (connsAllVia or connsPerNetnsVia,
	// with why the first could not run).
	Via string `json:"via"`
	// Unlisted counts the network namespaces the reader could not enter
	// (iter/tcp only): their connections are missing. UnlistedWhy: the error.
	Unlisted    int    `json:"unlisted_namespaces,omitempty"`
	UnlistedWhy string `json:"unlisted_why,omitempty"`
	// Indexed counts the ends only the connection index listed (in the
	// namespaces iter/tcp could not enter): Connection.Indexed.
	Indexed int `json:"indexed,omitempty"`
}

const (
	connsAllVia      = "iter/bpf_sk_storage_map over ez_sc_socks (every network namespace at once)"
	connsPerNetnsVia = "iter/tcp in each network namespace the reader can enter (setns: CAP_SYS_ADMIN; other pods' processes: hostPID), and ez_sc_index for the rest (no tx counters)"
)

// Connections lists the accelerated sockets of the datapath pinned under
// dir (List's connections).
func Connections(dir string) ([]Connection, error) {
	l, err := List(dir)
	return l.Conns, err
}

// List is Stream collected: every end in memory, all of them sorted
// (sortConnections).
func List(dir string) (Listing, error) {
	var conns []Connection
	l, err := Stream(context.Background(), dir, func(c Connection) error {
		conns = append(conns, c)
		return nil
	})
	sortConnections(conns)
	l.Conns = conns
	return l, err
}

// ListWindow is how many ends a streamed listing holds at a time: it sorts
// each window of ListWindow ends (or fewer, those of windowWait) as List
// sorts them all (a listing of at most ListWindow ends comes in List's
// order; in a longer one the two ends of a connection can fall in
// different windows).
const ListWindow = 1 << 16

// Stream lists the accelerated sockets of the datapath pinned under dir
// and hands each end to emit as the listing walks them, at most ListWindow
// ends held, so a listing of millions takes little memory and its first
// ends come at once. It uses a fresh copy of a listing iterator loaded
// against the pinned maps, so it works without a running agent:
// ez_sc_conns_all walks ez_sc_socks, every namespace at once; where the
// kernel refuses map-element iterators to this process, or the datapath
// holds more than allMaxConns connections, ez_sc_conns runs in every
// network namespace it can enter (bpfsys.NetNamespaces), and the
// connection index (ez_sc_index, batch reads) adds the ends it did not
// see, without their tx counters. It stops at emit's first error and when
// ctx ends (the asker went away); the Listing returned has no Conns.
func Stream(ctx context.Context, dir string, emit func(Connection) error) (Listing, error) {
	if !bpfsys.Exists(dir) {
		return Listing{}, fmt.Errorf("%w at %s", ErrNotInstalled, dir)
	}
	socks, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScSocks), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return Listing{}, fmt.Errorf("open pinned map ez_sc_socks: %w", err)
	}
	defer socks.Close()
	unreads, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScUnreads), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return Listing{}, fmt.Errorf("open pinned map ez_sc_unreads: %w", err)
	}
	defer unreads.Close()
	// Pinned by a build without the index: nil, iter/tcp alone.
	index, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScIndex), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Listing{}, fmt.Errorf("open pinned map ez_sc_index: %w", err)
	}
	if index != nil {
		defer index.Close()
	}
	spec, err := loadShortcut() // parsed once for either iterator
	if err != nil {
		return Listing{}, fmt.Errorf("datapath: parse embedded object: %w", err)
	}
	w := &window{ctx: ctx, emit: emit}
	ls := lister{spec: spec, socks: socks, unreads: unreads, index: index, out: w}
	var (
		l      Listing
		allErr error
	)
	big, n := ls.tooManyForAll()
	if big {
		allErr = fmt.Errorf("%d connections, past the %d it lists in linear time", n, allMaxConns)
	} else {
		l, allErr = ls.all()
		if allErr == nil || w.n > 0 {
			// Failed part-way: its ends are out, no second way lists them again.
			return l, errors.Join(allErr, w.flush())
		}
	}
	seen := map[uint64]bool{}
	l, err = ls.perNetns(seen)
	if err == nil {
		err = ls.fromIndex(&l, seen)
	}
	if err != nil && big && w.n == 0 {
		// iter/tcp could not run at all: the quadratic walk still lists.
		l, allErr = ls.all()
		return l, errors.Join(allErr, w.flush())
	}
	if ferr := w.flush(); err == nil {
		err = ferr
	}
	l.Via = fmt.Sprintf("%s (%s: %v)", connsPerNetnsVia, shortcutProgEzScConnsAll, allErr)
	return l, err
}

// allMaxConns is how many connections ez_sc_conns_all lists before
// iter/tcp in each namespace is used instead. The kernel's iterator over a
// socket-storage map resumes every read (32 KB of the seq buffer, 240
// ends) by walking its bucket from the start, and such a map has one
// bucket a CPU: a walk of n ends costs n²/480 steps over the bucket lists
// (at a million connections on 2 CPUs, minutes). iter/tcp resumes at its
// hash bucket: linear in the sockets of the node for each namespace.
const allMaxConns = 32768

// tooManyForAll says whether the datapath holds more than allMaxConns
// connections (one ez_sc_unreads record each, counted by batch lookups).
func (ls lister) tooManyForAll() (bool, int) {
	n, err := Entries(ls.unreads)
	return err == nil && n > allMaxConns, n
}

// windowWait is how long a window holds its first end at most: a slow walk
// hands its ends on sorted in shorter windows, never silent for long (an
// asker of the agent gives up after 30 s without a byte).
const windowWait = 2 * time.Second

// window holds up to ListWindow ends, sorts them and hands them on.
type window struct {
	ctx   context.Context
	emit  func(Connection) error
	buf   []Connection
	n     int       // ends added in all
	first time.Time // when buf's first end came
}

// add takes an end; an error (emit's, or ctx's end) stops the listing.
func (w *window) add(c Connection) error {
	if err := w.ctx.Err(); err != nil {
		return fmt.Errorf("the listing stopped: %w", err)
	}
	w.n++
	if len(w.buf) == 0 {
		w.first = time.Now()
	}
	w.buf = append(w.buf, c)
	if len(w.buf) >= ListWindow || (len(w.buf)%1024 == 0 && time.Since(w.first) > windowWait) {
		return w.flush()
	}
	return nil
}

// flush sorts the ends held and hands them on.
func (w *window) flush() error {
	sortConnections(w.buf)
	for _, c := range w.buf {
		if err := w.emit(c); err != nil {
			return err
		}
	}
	w.buf = w.buf[:0]
	return nil
}

// lister loads the listing iterators against the pinned maps they read.
type lister struct {
	spec           *ebpf.CollectionSpec
	socks, unreads *ebpf.Map
	index          *ebpf.Map // nil: pinned without ez_sc_index
	out            *window
}

// program loads one listing iterator.
func (ls lister) program(name string) (*ebpf.Program, error) {
	if err := bpfsys.TestRefusal(name); err != nil {
		return nil, err
	}
	// Only the iterator is loaded, against the pinned maps it reads.
	// The one program under a fixed name, so one struct takes either.
	coll, opts := againstPinned(ls.spec, map[string]*ebpf.Map{shortcutMapEzScSocks: ls.socks, shortcutMapEzScUnreads: ls.unreads})
	coll.Programs = map[string]*ebpf.ProgramSpec{"prog": ls.spec.Programs[name]}
	var objs struct {
		Prog *ebpf.Program `ebpf:"prog"`
	}
	if err := coll.LoadAndAssign(&objs, opts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("datapath: verifier rejected %s (connection listing): %+v", name, verr)
		}
		return nil, fmt.Errorf("datapath: load %s (connection listing): %w", name, err)
	}
	return objs.Prog, nil
}

// all runs ez_sc_conns_all once: every namespace, no setns.
func (ls lister) all() (Listing, error) {
	prog, err := ls.program(shortcutProgEzScConnsAll)
	if err != nil {
		return Listing{}, err
	}
	defer prog.Close()
	it, err := link.AttachIter(link.IterOptions{Program: prog, Map: ls.socks})
	if err != nil {
		return Listing{}, fmt.Errorf("attach the connection listing to ez_sc_socks: %w", err)
	}
	defer it.Close()
	rd, err := it.Open()
	if err != nil {
		return Listing{}, fmt.Errorf("open the connection listing: %w", err)
	}
	defer rd.Close()
	l := Listing{Via: connsAllVia}
	err = readRecords(bufio.NewReaderSize(rd, 64<<10), func(rec *shortcutEzConnRecord) error {
		return ls.out.add(connectionOf(rec))
	})
	if err != nil {
		return l, fmt.Errorf("read connection record: %w", err)
	}
	return l, nil
}

// perNetns runs ez_sc_conns in every network namespace it can enter.
func (ls lister) perNetns(seen map[uint64]bool) (Listing, error) {
	var l Listing
	prog, err := ls.program(shortcutProgEzScConns)
	if err != nil {
		return l, err
	}
	defer prog.Close()
	it, err := link.AttachIter(link.IterOptions{Program: prog})
	if err != nil {
		return l, fmt.Errorf("attach connections iterator: %w", err)
	}
	defer it.Close()
	namespaces, err := bpfsys.NetNamespaces()
	if err != nil {
		return l, fmt.Errorf("list network namespaces: %w", err)
	}
	for _, ns := range namespaces {
		err := runIn(it, ns, func(r io.Reader) error {
			err := readRecords(bufio.NewReader(r), func(rec *shortcutEzConnRecord) error {
				if seen[rec.Cookie] {
					return nil
				}
				seen[rec.Cookie] = true
				return ls.out.add(connectionOf(rec))
			})
			if err != nil {
				return fmt.Errorf("read connection record: %w", err)
			}
			return nil
		})
		if errors.Is(err, os.ErrPermission) {
			l.Unlisted++
			l.UnlistedWhy = err.Error()
			continue
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return l, fmt.Errorf("connections in %s: %w", ns, err)
		}
	}
	if l.Unlisted > 0 {
		// setns needs CAP_SYS_ADMIN (the chart's adoption.enabled grants it).
		slog.Debug("connections: some network namespaces could not be entered; the connection index lists theirs", "namespaces", l.Unlisted, "err", l.UnlistedWhy)
	}
	return l, nil
}

// fromIndex adds the ends of ez_sc_index that l does not list (iter/tcp
// could not enter their namespace). An end is listed while its
// connection's unread record exists: both ends paired, not both closed.
// seen holds the cookies listed so far. The index is read a batch at a
// time and only the ends not seen are held: a million connections every
// iter/tcp listed cost a few hundred syscalls here, no memory.
func (ls lister) fromIndex(l *Listing, seen map[uint64]bool) error {
	if ls.index == nil {
		return nil
	}
	type entry struct {
		cookie uint64
		ix     shortcutEzConnIndex
	}
	var entries []entry
	serverOf := map[uint64]uint64{} // an unseen client's cookie -> its server's
	err := batchWalk(ls.index, func(cookie *uint64, ix *shortcutEzConnIndex) {
		if ix.Flags&uint32(shortcutEzSockFlagsEZ_F_SERVER) != 0 && !seen[ix.PeerCookie] {
			serverOf[ix.PeerCookie] = *cookie
		}
		if !seen[*cookie] {
			entries = append(entries, entry{*cookie, *ix})
		}
	})
	if err != nil {
		return fmt.Errorf("walk ez_sc_index: %w", err)
	}
	for _, e := range entries {
		if seen[e.cookie] {
			continue
		}
		seen[e.cookie] = true
		c := indexedConnection(e.cookie, &e.ix)
		c.PeerCookie = cmp.Or(c.PeerCookie, serverOf[c.Cookie])
		ukey, rx := e.ix.unreadKey(e.cookie)
		var u shortcutEzUnread
		if err := ls.unreads.Lookup(&ukey, &u); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue // not paired yet, or both ends closed
		} else if err != nil {
			return fmt.Errorf("read ez_sc_unreads: %w", err)
		}
		c.RxUnread, c.RxBound, c.Switched = u.Unread[rx], u.Bound[rx], u.Switched != 0
		l.Indexed++
		if err := ls.out.add(c); err != nil {
			return err
		}
	}
	return nil
}

// batchWalk hands every entry of the hash map m to fn, entryBatch entries
// a syscall (BPF_MAP_LOOKUP_BATCH), or one key and lookup at a time where
// the kernel has no batch operations.
func batchWalk[K, V any](m *ebpf.Map, fn func(*K, *V)) error {
	keys, vals := make([]K, entryBatch), make([]V, entryBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(&keys[i], &vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) && n == 0 {
			break
		}
		if err != nil {
			return err
		}
	}
	var (
		k K
		v V
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		fn(&k, &v)
	}
	return it.Err()
}

// unreadKey is the ez_sc_unreads key of the end cookie with this index
// entry, the client's cookie (shortcut/unread.h unread_key), and the
// direction the end receives (the client 1, the server 0).
func (ix *shortcutEzConnIndex) unreadKey(cookie uint64) (key uint64, rx int) {
	if ix.Flags&uint32(shortcutEzSockFlagsEZ_F_CLIENT) != 0 {
		return cookie, 1
	}
	return ix.PeerCookie, 0
}

// indexedConnection is an end as ez_sc_index holds it.
func indexedConnection(cookie uint64, ix *shortcutEzConnIndex) Connection {
	c := end(cookie, ix.PeerCookie, &ix.Key, ix.Flags, ix.NetnsCookie, ix.NetnsIno, ix.CgroupId)
	c.Indexed = true
	return c
}

// end is what both ways of listing know of an end.
func end(cookie, peer uint64, key *shortcutEzConnKey, flags uint32, netns uint64, netnsIno uint32, cgroup uint64) Connection {
	role := "server"
	if flags&uint32(shortcutEzSockFlagsEZ_F_CLIENT) != 0 {
		role = "client"
	}
	return Connection{
		Cookie:      cookie,
		PeerCookie:  peer,
		Role:        role,
		Client:      netip.AddrPortFrom(netip.AddrFrom16(key.ClientIp).Unmap(), key.ClientPort),
		Server:      netip.AddrPortFrom(netip.AddrFrom16(key.ServerIp).Unmap(), key.ServerPort),
		NetnsCookie: netns,
		NetnsInode:  netnsIno,
		Adopted:     flags&uint32(shortcutEzSockFlagsEZ_F_ADOPTED) != 0,
		CgroupID:    cgroup,
	}
}

// sortConnections puts the two ends of a connection next to each other,
// client first.
func sortConnections(conns []Connection) {
	slices.SortFunc(conns, func(a, b Connection) int {
		return cmp.Or(a.Client.Compare(b.Client), a.Server.Compare(b.Server), cmp.Compare(a.Role, b.Role))
	})
}

// readConnections decodes fixed-width struct ez_conn_record until EOF.
func readConnections(r io.Reader) ([]Connection, error) {
	var out []Connection
	err := readRecords(r, func(rec *shortcutEzConnRecord) error {
		out = append(out, connectionOf(rec))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read connection record: %w", err)
	}
	return out, nil
}

// readRecords decodes the fixed-width records an iterator writes
// (bpf_seq_write) until EOF and hands each to add, stopping at its first
// error.
func readRecords[T any](r io.Reader, add func(*T) error) error {
	for {
		var rec T
		err := binary.Read(r, binary.LittleEndian, &rec)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := add(&rec); err != nil {
			return err
		}
	}
}

func connectionOf(rec *shortcutEzConnRecord) Connection {
	c := end(rec.Cookie, rec.PeerCookie, (*shortcutEzConnKey)(&rec.Key), rec.Flags, rec.NetnsCookie, rec.NetnsIno, rec.CgroupId)
	c.TxMsgs, c.TxBytes = rec.TxMsgs, rec.TxBytes
	c.RxUnread, c.RxBound, c.Switched = rec.RxUnread, rec.RxBound, rec.Switched != 0
	c.Left = rec.State == uint32(shortcutEzSockStateEZ_SOCK_LEFT)
	return c
}
