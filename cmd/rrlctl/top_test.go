package main

import (
	"encoding/json"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/dnsrake/rrl/internal/testutil"
)

// TestTopLimitedGroups floods a socket attached through pins from a /24 of many
// spoofed sources and from a single address, next to a light source, and runs top
// during the flood: it lists the /24 at the /24 level and the address at /32, with
// the rates they were sent at (within 20%) and the limit, and never the light source.
func TestTopLimitedGroups(t *testing.T) {
	pin := filepath.Join(bpffs(t), "rrl")
	const L = 500.0
	if code, out, errOut := rrlctl("load", "-pin", pin, "-requests-per-second", "500", "-report-only=false"); code != exitOK {
		t.Fatalf("load: exit %d: %s%s", code, out, errOut)
	}
	conn, err := loadgen.Listen("udp4", netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := rrl.AttachPinned(conn, pin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dst := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	raw, err := loadgen.NewRawSender(dst)
	if err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	defer raw.Close()
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		loadgen.ReadUntil(conn, stop, 300*time.Millisecond, 30*time.Second, func([]byte, netip.AddrPort) {})
		close(drained)
	}()
	defer func() { close(stop); <-drained }()

	defer testutil.HoldLive(t)()
	const dur = 3 * time.Second
	flows := []loadgen.Flow{
		{Name: "slash24", Rate: 4 * L, End: dur, Src: func(i int) netip.AddrPort {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 2, 2, byte(1 + i%200)}), uint16(30000+i%200))
		}},
		{Name: "single", Rate: 3 * L, End: dur, Src: func(int) netip.AddrPort { return netip.MustParseAddrPort("127.1.1.1:40000") }},
		{Name: "light", Rate: 0.05 * L, End: dur, Src: func(int) netip.AddrPort { return netip.MustParseAddrPort("127.9.9.9:50000") }},
	}
	start := time.Now()
	log := loadgen.NewSendLog(start, len(flows))
	sent := make(chan error, 1)
	go func() {
		_, err := loadgen.Pace(start, flows, dur, 2*time.Millisecond, func(fi int, src netip.AddrPort, payload []byte) error {
			log.Add(fi)
			return raw.Send(loadgen.Packet(src, dst, payload))
		})
		sent <- err
	}()
	time.Sleep(time.Until(start.Add(2 * time.Second)))
	before := log.Since()
	code, jsonOut, errOut := rrlctl("top", "-pin", pin, "-n", "0", "-json")
	at := (before + log.Since()) / 2
	_, text, _ := rrlctl("top", "-pin", pin, "-n", "0")
	if err := <-sent; err != nil {
		t.Fatalf("send: %v", err)
	}
	var rep topReport
	if code != exitOK || json.Unmarshal([]byte(jsonOut), &rep) != nil {
		t.Fatalf("top -json: exit %d: %s%s", code, jsonOut, errOut)
	}
	t.Logf("top:\n%s", text)

	tau := time.Duration(math.Round(200e6 / math.Ln2)) // the estimator's time constant: a half-life of 200 ms
	want := []struct {
		fi           int
		level, group string
	}{
		{0, "ipv4/24", "127.2.2.0/24"},
		{1, "ipv4/32", "127.1.1.1/32"},
	}
	if len(rep.Limited) != len(want) {
		t.Errorf("top -json lists %d groups, want %d: %+v", len(rep.Limited), len(want), rep.Limited)
	}
	lines := strings.Split(text, "\n")
	for _, w := range want {
		sentRate := log.DecayedRate(w.fi, at, tau)
		found := false
		for _, g := range rep.Limited {
			if g.Node.String() != w.level || g.Group.String() != w.group {
				continue
			}
			found = true
			// JSON was read at about time at; the rate decays fast after a
			// stall, so compare with what was sent up to then.
			if g.Rate < sentRate*0.8 || g.Rate > sentRate*1.2 || g.Limit != L || g.Dropped == 0 {
				t.Errorf("%s: %+v, sent at %.1f/s", flows[w.fi].Name, g, sentRate)
			}
		}
		if !found {
			t.Errorf("top -json: %s %s not listed", w.level, w.group)
		}
		listed := false
		for _, l := range lines {
			f := strings.Fields(l)
			listed = listed || len(f) >= 4 && f[0] == w.level && f[1] == w.group && f[3] == "500"
		}
		if !listed {
			t.Errorf("top does not list %s %s with its limit", w.level, w.group)
		}
	}
	if strings.Contains(text+jsonOut, "127.9.9.") {
		t.Errorf("top lists the light source")
	}
	if !strings.Contains(text, "groups limited now") || !strings.Contains(text, "not addresses") {
		t.Errorf("top: limited groups and sketch summary expected:\n%s", text)
	}
}
