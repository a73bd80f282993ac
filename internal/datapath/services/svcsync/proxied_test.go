package svcsync

import (
	"slices"
	"testing"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
)

func TestParseChoice(t *testing.T) {
	for _, c := range []struct {
		v       string
		proxied bool
		uid     uint32
		hasUID  bool
		bad     bool
	}{
		{v: "socket"}, {v: "proxy", proxied: true}, {v: "proxy:1337", proxied: true, uid: 1337, hasUID: true},
		{v: "proxy:0", proxied: true, hasUID: true}, {v: ""}, {v: "Proxy", bad: true}, {v: "proxy:", bad: true},
		{v: "proxy:-1", bad: true}, {v: "proxy:4294967295", bad: true}, {v: "proxy:1337,2102", bad: true}, {v: "sidecar", bad: true},
	} {
		if c.v == "" {
			c.bad = true
		}
		p, uid, has, err := ParseChoice(c.v)
		if (err != nil) != c.bad || p != c.proxied || uid != c.uid || has != c.hasUID {
			t.Errorf("ParseChoice(%q) = %v %d %v %v", c.v, p, uid, has, err)
		}
	}
}

func TestParseFileProxied(t *testing.T) {
	_, _, ps, err := parseFile([]byte(`
services: []
proxied:
- {cgroup: /sys/fs/cgroup/pods/a/, choice: "proxy:1337"}
- {cgroup: /sys/fs/cgroup/pods/b}
- {cgroup: /sys/fs/cgroup/pods/c, choice: socket}
`), Families{IPv4: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []lb.Proxied{{Cgroup: "/sys/fs/cgroup/pods/a", UID: 1337, HasUID: true}, {Cgroup: "/sys/fs/cgroup/pods/b"}}
	if !slices.Equal(ps, want) {
		t.Errorf("proxied %v, want %v", ps, want)
	}
	for _, bad := range []string{
		"proxied:\n- {cgroup: pods/a}\n",
		"proxied:\n- {cgroup: /a, choice: proxy:x}\n",
		"proxied:\n- {cgroup: /a}\n- {cgroup: /a/}\n",
		"proxied:\n- {cgroup: /a, uid: 3}\n",
	} {
		if _, _, _, err := parseFile([]byte(bad), Families{IPv4: true}); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
