package rrl

import (
	"net/netip"
	"sync"
	"testing"
	"time"
)

func TestUpdate(t *testing.T) {
	r, c := newTestRRL(t, "responses-per-second", "2", "slip-ratio", "0")
	attacker := udp("192.0.2.7")
	for range 5 {
		r.Debit(attacker, &www)
	}
	if act, _, _ := r.Debit(attacker, &www); act != Drop {
		t.Fatalf("before Update: %v, want Drop", act)
	}
	update := func(kv ...string) bool {
		t.Helper()
		cfg := NewConfig()
		for i := 0; i+1 < len(kv); i += 2 {
			if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
				t.Fatal(err)
			}
		}
		fresh, err := r.Update(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return fresh
	}
	// The same limit, another slip-ratio and window: the account stays limited.
	if update("responses-per-second", "2", "slip-ratio", "1", "window", "10") {
		t.Error("Update of limits started a fresh table")
	}
	if act, _, rtr := r.Debit(attacker, &www); act != Slip || rtr != RTRateLimit {
		t.Errorf("after Update with the same limit: %v %v, want Slip (slip-ratio 1)", act, rtr)
	}
	if n := r.GetStats(false).CacheLength; n != 1 {
		t.Errorf("accounts after Update: %d", n)
	}
	// A raised limit lets it through as soon as its balance allows: after 7 debits
	// of 0.5 s from one second of credit at t0 the account's balance is zero at
	// t0+2.5s, and debits now cost 0.01 s.
	// At t0+2.6s a debit at the old cost would leave it negative.
	update("responses-per-second", "100")
	c.now = t0.Add(2600 * time.Millisecond)
	if act, _, _ := r.Debit(attacker, &www); act != Send {
		t.Errorf("after raising the limit: %v, want Send", act)
	}
	// Report-only and exemptions change in place.
	update("responses-per-second", "1", "report-only", "true")
	for range 5 {
		if act, _, rtr := r.Debit(attacker, &www); act != Send || (rtr != RTOk && rtr != RTRateLimit) {
			t.Fatalf("report-only: %v %v", act, rtr)
		}
	}
	update("responses-per-second", "1", "exempt-clients", "192.0.2.0/24")
	if act, ipr, _ := r.Debit(attacker, &www); act != Send || ipr != IPExempt {
		t.Errorf("exempt: %v %v", act, ipr)
	}
	// A new client-network length: a fresh table, said so.
	if !update("responses-per-second", "1", "ipv4-prefix-length", "16") {
		t.Error("prefix length change did not report a fresh table")
	}
	if n := r.GetStats(false).CacheLength; n != 0 {
		t.Errorf("accounts in the fresh table: %d", n)
	}
	if !update("responses-per-second", "1", "ipv4-prefix-length", "16", "max-table-size", "5000") {
		t.Error("max-table-size change did not report a fresh table")
	}
	// Refused settings change nothing.
	if _, err := r.Update(&Config{}); err == nil {
		t.Error("Update(&Config{}) accepted")
	}
	if _, err := r.Update(nil); err == nil {
		t.Error("Update(nil) accepted")
	}
}

// TestUpdateEvents: an episode followed across an Update that keeps the table ends
// normally; one whose table is replaced ends as evicted.
func TestUpdateEvents(t *testing.T) {
	r, c, log := newEventRRL(t, 0, "responses-per-second", "2")
	for range 10 {
		r.Debit(udp("192.0.2.7"), &www)
	}
	same := NewConfig()
	same.SetValue("responses-per-second", "2")
	same.SetValue("slip-ratio", "1")
	same.SetEventFunc(log.add)
	if fresh, err := r.Update(same); err != nil || fresh {
		t.Fatal(fresh, err)
	}
	c.now = t0.Add(time.Second)
	r.Debit(udp("203.0.113.1"), &www)
	c.now = t0.Add(8 * time.Second)
	r.Debit(udp("203.0.113.1"), &www)
	ev := log.take()
	if len(ev) != 2 || ev[0].Stop || !ev[1].Stop || ev[1].Evicted {
		t.Fatalf("across an Update keeping the table: %+v", ev)
	}

	c.now = t0.Add(10 * time.Second)
	for range 10 {
		r.Debit(udp("192.0.2.7"), &www)
	}
	cfg := NewConfig()
	cfg.SetValue("responses-per-second", "2")
	cfg.SetValue("ipv4-prefix-length", "16")
	cfg.SetEventFunc(log.add)
	if fresh, err := r.Update(cfg); err != nil || !fresh {
		t.Fatal(fresh, err)
	}
	c.now = t0.Add(12 * time.Second)
	r.Debit(udp("203.0.113.1"), &www)
	ev = log.take()
	if len(ev) != 2 || ev[0].Stop || !ev[1].Stop || !ev[1].Evicted || ev[1].Network != netip.MustParsePrefix("192.0.2.0/24") {
		t.Fatalf("events %+v", ev)
	}
}

// TestUpdateConcurrent runs Update against Debit calls (go test -race).
func TestUpdateConcurrent(t *testing.T) {
	r := NewRRL(NewConfig())
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := udp("192.0.2.1")
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				src.IP[15] = byte(i + g)
				r.Debit(src, &www)
			}
		}()
	}
	log := &eventLog{}
	for i := range 200 {
		cfg := NewConfig()
		cfg.SetValue("responses-per-second", []string{"1", "5", "1000"}[i%3])
		cfg.SetValue("report-only", []string{"true", "false"}[i%2])
		if i%50 == 0 {
			cfg.SetValue("ipv4-prefix-length", []string{"24", "16"}[i/50%2])
		}
		if i%7 == 0 {
			cfg.SetEventFunc(log.add)
		}
		if _, err := r.Update(cfg); err != nil {
			t.Fatal(err)
		}
		r.GetStats(i%10 == 0)
	}
	close(stop)
	wg.Wait()
}

// TestLimiterUpdateKeepsNames: an Update that leaves the names settings as they
// were (here it changes the request limits and the capacity) keeps the names
// judge's learner, and with it every name learnt: a name answered before the
// Update is known after it, one never answered is not.
func TestLimiterUpdateKeepsNames(t *testing.T) {
	t0 := coarseNanos()
	l := namesLimiter(t, "on", t0)
	ln := l.names.Load()
	before := ln.learner.Load()
	known := func(name string) bool {
		t.Helper()
		var q qname
		if !l.readName(queryBytes(t, name), &q) {
			t.Fatalf("%s not read", name)
		}
		return l.names.Load().learner.Load().classify(&q, uint64(t0)).known
	}
	if !known("www.victim.test.") || known("never.victim.test.") {
		t.Fatal("before the Update: www.victim.test. not known, or never.victim.test. known")
	}
	cfg := NewConfig()
	for _, kv := range [][2]string{{"capacity", "3000"}, {"names", "on"}, {"requests-per-second", "50"}, {"ipv4-prefix-length", "22"}} {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if l.names.Load() != ln || ln.learner.Load() != before {
		t.Error("an Update with the same names settings made a new names state or learner")
	}
	if !known("www.victim.test.") {
		t.Error("www.victim.test., answered before the Update, is not known after it")
	}
	if known("never.victim.test.") {
		t.Error("never.victim.test., never answered, is known after the Update")
	}
}
