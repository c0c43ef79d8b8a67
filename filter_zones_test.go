//go:build linux

package rrl

import (
	"fmt"
	"math"
	"net"
	"path/filepath"
	"testing"
)

// TestZoneRatesPinned sends real queries through a pinned filter whose names judge
// is on (its tables fed as Protect is to feed them: configured victim.test.,
// other.test. learnt from an answer's SOA, www.other.test. known) and reads them back
// through a second handle on the pins, as rrlctl top does: the zones it can name
// (configured, asked for, the root) with their random names' rates in the ratio
// they were sent, heaviest first, what the tables hold, and the sketch's bound on
// the heaviest zone, named or not.
func TestZoneRatesPinned(t *testing.T) {
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	cfg := NewConfig()
	for _, kv := range [][2]string{{"capacity", "auto"}, {"zones", "victim.test."}} {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := LoadPinned(cfg, dir, -1, -1); err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := AttachPinned(conn, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.mu.Lock()
	s, now, err := f.readSettings()
	f.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := mapNameTables(f.objs.Names, f.objs.Apexes)
	if err != nil {
		t.Fatal(err)
	}
	defer tables.close()
	lr, ok := tables.learner(s.NameSeed, cfg.zones)
	if !ok {
		t.Fatal("learner")
	}
	z := newTestZone("www.other.test.")
	z.learn(lr, now, "www.other.test.", "nx.other.test.")
	setNamesSettings(t, f.objs.Settings, func(s *filterSettings) { s.NamesOn = 1 })

	client, err := net.DialUDP("udp4", nil, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// Interleaved, 8:2:1: victim.test., other.test., and a zone nobody knows
	// (counted under the root); and known names, which the zone sketch does not
	// count.
	sent := map[string]int{}
	for i := range 1100 {
		zone := []string{"victim.test.", "victim.test.", "victim.test.", "victim.test.", "victim.test.", "victim.test.", "victim.test.", "victim.test.", "other.test.", "other.test.", "nowhere.test."}[i%11]
		name := fmt.Sprintf("r%d.%s", i, zone)
		if i%5 == 0 {
			name = "www.other.test."
		} else {
			sent[zone]++
		}
		if _, err := client.Write(namesQuery(t, name)); err != nil {
			t.Fatal(err)
		}
	}

	r, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := r.ZoneRates("Other.Test", "nowhere.test.")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *got)
	if !got.On || got.Limit != 0 || got.Apexes != 2 || got.ConfiguredApexes != 1 || got.Names != 1 {
		t.Errorf("on %v limit %v apexes %d (configured %d) names %d; want on, no limit, 2 (1), 1", got.On, got.Limit, got.Apexes, got.ConfiguredApexes, got.Names)
	}
	want := []struct {
		zone              string
		known, configured bool
	}{
		{"victim.test.", true, true},
		{"other.test.", true, false},
		{".", false, false},
		{"nowhere.test.", false, false},
	}
	if len(got.Zones) != len(want) {
		t.Fatalf("zones %+v, want %d", got.Zones, len(want))
	}
	rates := map[string]float64{}
	for i, w := range want {
		zr := got.Zones[i]
		rates[zr.Zone] = zr.Rate
		if zr.Zone != w.zone || zr.Known != w.known || zr.Configured != w.configured {
			t.Errorf("zone %d: %+v, want %s known %v configured %v", i, zr, w.zone, w.known, w.configured)
		}
	}
	// The rates are decayed counts of one burst, so they stand in the ratio of
	// what was sent; nowhere.test. is not a zone: its names count under the root,
	// and its own cells hold nothing (unless another zone's hash lands there).
	for _, c := range []struct{ a, b, sentB string }{{"victim.test.", "other.test.", "other.test."}, {"other.test.", ".", "nowhere.test."}} {
		wantRatio := float64(sent[c.a]) / float64(sent[c.sentB])
		if ratio := rates[c.a] / rates[c.b]; math.Abs(ratio/wantRatio-1) > 0.15 {
			t.Errorf("%s / %s: %.3f, sent %.3f", c.a, c.b, ratio, wantRatio)
		}
	}
	if rates["nowhere.test."] > rates["."]/10 {
		t.Errorf("nowhere.test. %v, the root %v: a name that is no zone was counted as one", rates["nowhere.test."], rates["."])
	}
	if got.Heaviest < rates["victim.test."] || got.BusyCells < 6 || got.OverLimit != 0 {
		t.Errorf("heaviest %v (victim.test. %v), busy %d, over limit %d", got.Heaviest, rates["victim.test."], got.BusyCells, got.OverLimit)
	}
	if _, err := r.ZoneRates("bad..name"); err == nil {
		t.Error("a name that is not a domain name accepted")
	}
}
