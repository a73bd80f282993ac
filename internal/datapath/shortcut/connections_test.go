package shortcut

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

// struct ez_conn_record is 136 bytes in C: 5 u64, the 48-byte key, 4 u32,
// an s64, 3 u32 (one padding), the cgroup id.
func TestConnRecordSize(t *testing.T) {
	if n := binary.Size(shortcutEzConnRecord{}); n != 136 {
		t.Fatalf("ez_conn_record decodes %d bytes, want 136", n)
	}
}

func TestReadConnections(t *testing.T) {
	var buf bytes.Buffer
	rec := shortcutEzConnRecord{Cookie: 11, PeerCookie: 12, NetnsCookie: 4096, TxMsgs: 3, TxBytes: 300, NetnsIno: 4026531840,
		Flags: uint32(shortcutEzSockFlagsEZ_F_CLIENT), State: uint32(shortcutEzSockStateEZ_SOCK_PAIRED)}
	rec.Key.ClientIp = netip.MustParseAddr("::ffff:10.0.0.2").As16()
	rec.Key.ServerIp = netip.MustParseAddr("fd00::3").As16()
	rec.Key.ClientPort, rec.Key.ServerPort = 40000, 7000
	rec.RxUnread, rec.RxBound = 4096, 1<<22
	binary.Write(&buf, binary.LittleEndian, &rec)
	rec.Cookie, rec.PeerCookie, rec.Flags = 12, 11, uint32(shortcutEzSockFlagsEZ_F_SERVER)
	rec.Switched, rec.State = 1, uint32(shortcutEzSockStateEZ_SOCK_LEFT)
	binary.Write(&buf, binary.LittleEndian, &rec)

	conns, err := readConnections(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 2 {
		t.Fatalf("%d connections, want 2", len(conns))
	}
	c, s := conns[0], conns[1]
	if c.Role != "client" || s.Role != "server" || c.Cookie != 11 || c.PeerCookie != 12 || s.Cookie != 12 {
		t.Errorf("ends: %+v %+v", c, s)
	}
	if c.Client.String() != "10.0.0.2:40000" || c.Server.String() != "[fd00::3]:7000" {
		t.Errorf("addresses: %s -> %s", c.Client, c.Server)
	}
	if c.TxMsgs != 3 || c.TxBytes != 300 || c.NetnsCookie != 4096 || c.NetnsInode != 4026531840 {
		t.Errorf("counts: %+v", c)
	}
	if c.RxUnread != 4096 || c.RxBound != 1<<22 || c.Switched || c.Left || !s.Switched || !s.Left {
		t.Errorf("unread: %+v %+v", c, s)
	}

	// A truncated record is an error, not a silent drop.
	buf.Write(make([]byte, 50))
	if _, err := readConnections(&buf); err == nil {
		t.Error("truncated record accepted")
	}
}
