package main

import (
	"encoding/json"
	"fmt"
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
	"github.com/miekg/dns"
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

// TestTopNames sends random names under three zones through a socket attached to a
// pinned filter loaded with the capacity mode and victim.test. configured, and runs
// top with -zones: it lists the configured zone, the names given and the root with
// the zone sketch's estimates, what the filter's tables hold, and says that zones
// learnt from answers cannot be named. With the names judge on in the settings the
// program loads, the rates stand in the ratio sent (victim.test.'s random names
// under the configured zone are counted under the root while the kernel's table
// does not hold it); with it off, top says so and every rate is 0.
func TestTopNames(t *testing.T) {
	pin := filepath.Join(bpffs(t), "rrl")
	if code, out, errOut := rrlctl("load", "-pin", pin, "-capacity", "auto", "-zones", "victim.test."); code != exitOK {
		t.Fatalf("load: exit %d: %s%s", code, out, errOut)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := rrl.AttachPinned(conn, pin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	client, err := net.DialUDP("udp4", nil, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for i := range 600 {
		zone := []string{"victim.test.", "victim.test.", "other.test."}[i%3]
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("r%d.%s", i, zone), dns.TypeA)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	code, jsonOut, errOut := rrlctl("top", "-pin", pin, "-n", "0", "-zones", "other.test.,Nowhere.Test", "-json")
	_, text, _ := rrlctl("top", "-pin", pin, "-n", "0", "-zones", "other.test.")
	var rep topReport
	if code != exitOK || json.Unmarshal([]byte(jsonOut), &rep) != nil || rep.Names == nil {
		t.Fatalf("top -json: exit %d: %s%s", code, jsonOut, errOut)
	}
	t.Logf("top:\n%s", text)
	zones := map[string]rrl.ZoneRate{}
	for _, z := range rep.Names.Zones {
		zones[z.Zone] = z
	}
	for _, z := range []string{"victim.test.", "other.test.", "nowhere.test.", "."} {
		if _, ok := zones[z]; !ok {
			t.Errorf("top -json does not list %s: %+v", z, rep.Names.Zones)
		}
	}
	if len(rep.Names.Zones) != 4 {
		t.Errorf("top -json lists %d zones, want 4: %+v", len(rep.Names.Zones), rep.Names.Zones)
	}
	switch v, root := zones["victim.test."], zones["."]; {
	case rep.Names.On && v.Known:
		// The configured zone is in the kernel's table: its 400 random names
		// count under it, other.test.'s 200 under the root.
		if ratio := v.Rate / root.Rate; !v.Configured || math.Abs(ratio-2) > 0.4 || rep.Names.Heaviest < v.Rate {
			t.Errorf("names on: %+v, heaviest %v", rep.Names.Zones, rep.Names.Heaviest)
		}
	case rep.Names.On:
		// No process fed the kernel's table: every zone counts under the
		// root, which holds all 600.
		if root.Rate <= 0 || v.Rate > root.Rate/10 || rep.Names.Heaviest < root.Rate {
			t.Errorf("names on: %+v, heaviest %v", rep.Names.Zones, rep.Names.Heaviest)
		}
	default:
		for _, z := range rep.Names.Zones {
			if z.Rate != 0 || z.Known {
				t.Errorf("names off: %+v counted or known", z)
			}
		}
		if rep.Names.BusyCells != 0 || !strings.Contains(text, "names judge off") {
			t.Errorf("names off: %d busy cells; text:\n%s", rep.Names.BusyCells, text)
		}
	}
	for _, want := range []string{"random names by zone", "victim.test.", "other.test.", "names under no known zone", "zone sketch: heaviest zone at most", "names known to exist", "held as hashes"} {
		if !strings.Contains(text, want) {
			t.Errorf("top does not say %q:\n%s", want, text)
		}
	}
	if code, _, errOut := rrlctl("top", "-pin", pin, "-zones", "bad..name"); code == exitOK || !strings.Contains(errOut, "not a domain name") {
		t.Errorf("top -zones bad..name: exit %d: %s", code, errOut)
	}
}
