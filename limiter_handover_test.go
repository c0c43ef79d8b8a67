package rrl

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestInheritLimiter: a reload's successor (takeOver calls inheritLimiter) carries
// on with its predecessor's Go Limiter under its own Config: the names learnt are
// known to it at once, the capacity controller is the same and keeps sampling after
// the predecessor's Close, which neither stops it nor updates the Limiter; a second
// successor of the same predecessor gets nothing.
func TestInheritLimiter(t *testing.T) {
	cfg := func(rps string) *Config {
		c := NewConfig()
		for _, kv := range [][2]string{{"capacity", "5000"}, {"zones", "victim.test."}, {"requests-per-second", rps}} {
			if err := c.SetValue(kv[0], kv[1]); err != nil {
				t.Fatal(err)
			}
		}
		return c
	}
	pred, err := NewProtection(answerA, cfg("100"), WithoutFilter())
	if err != nil {
		t.Fatal(err)
	}
	defer pred.Close()
	l := pred.goLimiter()
	soa, _ := dns.NewRR("victim.test. 300 IN SOA ns1.victim.test. h.victim.test. 1 7200 900 1209600 300")
	rr, _ := dns.NewRR("www.victim.test. 300 IN A 192.0.2.1")
	resp := new(dns.Msg)
	resp.SetQuestion("www.victim.test.", dns.TypeA)
	resp.Response, resp.Answer, resp.Ns = true, []dns.RR{rr}, []dns.RR{soa}
	pred.observeResponse(resp, "")
	known := func(l *Limiter, name string) bool {
		var q qname
		if !l.readName(queryBytes(t, name), &q) {
			t.Fatalf("%s: not read", name)
		}
		return l.names.Load().learner.Load().classify(&q, uint64(coarseNanos())).known
	}
	if !known(l, "www.victim.test.") || known(l, "x7f3k.victim.test.") {
		t.Fatal("the predecessor did not learn www.victim.test. alone")
	}
	run := pred.capacity

	inherit := func(p *Protection) {
		holders.Lock()
		p.mu.Lock()
		p.inheritLimiter(pred)
		p.mu.Unlock()
		holders.Unlock()
	}
	succ, err := NewProtection(answerA, cfg("200"), WithoutFilter())
	if err != nil {
		t.Fatal(err)
	}
	defer succ.Close()
	inherit(succ)
	if succ.Limiter() != l || pred.Limiter() != l {
		t.Fatalf("limiters %p (successor) and %p (predecessor), want both %p", succ.Limiter(), pred.Limiter(), l)
	}
	if !known(l, "www.victim.test.") {
		t.Error("the name learnt is unknown after the hand-over")
	}
	if got := l.params.Load().limit[nodeIPv4First]; got != fixedFromFloat(200) {
		t.Errorf("the Limiter's /32 limit is %v, want the successor's 200", got.Float64())
	}
	if succ.capacity != run || pred.capacity != nil || run == nil {
		t.Fatalf("controllers %p (successor) and %p (predecessor), want %p and nil", succ.capacity, pred.capacity, run)
	}
	other, err := NewProtection(answerA, cfg("300"), WithoutFilter())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	inherit(other)
	if other.Limiter() != nil {
		t.Error("a second successor inherited the Limiter handed over already")
	}

	if _, err := pred.Update(cfg("50")); err != nil {
		t.Fatal(err)
	}
	if err := pred.Close(); err != nil {
		t.Fatal(err)
	}
	if got := l.params.Load().limit[nodeIPv4First]; got != fixedFromFloat(200) {
		t.Errorf("after the predecessor's Update and Close the /32 limit is %v, want 200", got.Float64())
	}
	before := run.samples.Load()
	deadline := time.Now().Add(5 * time.Second)
	for run.samples.Load() < before+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if run.samples.Load() < before+2 {
		t.Error("the controller stopped with the predecessor")
	}
	if err := succ.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-run.done:
	case <-time.After(5 * time.Second):
		t.Error("the controller runs on after the successor's Close")
	}
}
