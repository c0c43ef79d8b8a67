package rrl_test

// This file is a program written against github.com/markdingo/rrl, the way its
// README uses it, with only the import path changed. It compiles only while this
// package stays a drop-in replacement; TestMarkdingoProgram also runs it.

import (
	"net"
	"testing"
	"time"

	"github.com/dnsrake/rrl"
)

type request struct {
	src    net.Addr
	cookie bool
}

type server struct{ sent, badCookies, truncated, dropped int }

func (s *server) Send(truncated bool) {
	if truncated {
		s.truncated++
	} else {
		s.sent++
	}
}

func makeTuple(rcode, answers, ns int, qtype uint16, qname string) *rrl.ResponseTuple {
	return &rrl.ResponseTuple{
		Class:             1,
		Type:              qtype,
		AllowanceCategory: rrl.NewAllowanceCategory(rcode, answers, ns),
		SalientName:       qname,
	}
}

func markdingoProgram(requests []request, now func() time.Time) (*server, rrl.Stats) {
	cfg := rrl.NewConfig()
	for _, kv := range [][2]string{
		{"window", "15"}, {"ipv4-prefix-length", "24"}, {"ipv6-prefix-length", "56"},
		{"responses-per-second", "5"}, {"nodata-per-second", "5"}, {"nxdomains-per-second", "5"},
		{"referrals-per-second", "5"}, {"errors-per-second", "5"}, {"requests-per-second", "0"},
		{"slip-ratio", "2"}, {"max-table-size", "100000"},
	} {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			panic(err)
		}
	}
	cfg.SetNowFunc(now)
	if !cfg.IsActive() {
		panic("inactive")
	}
	var R *rrl.RRL = rrl.NewRRL(cfg)

	srv := &server{}
	for _, req := range requests {
		tuple := makeTuple(0, 1, 0, 1, "www.example.test.")
		var action rrl.Action
		var ipr rrl.IPReason
		var rtr rrl.RTReason
		action, ipr, rtr = R.Debit(req.src, tuple)
		_ = ipr == rrl.IPOk || ipr == rrl.IPNotConfigured || ipr == rrl.IPNotReached ||
			ipr == rrl.IPRateLimit || ipr == rrl.IPCacheFull || ipr == rrl.IPLast
		_ = rtr == rrl.RTOk || rtr == rrl.RTNotConfigured || rtr == rrl.RTNotReached ||
			rtr == rrl.RTRateLimit || rtr == rrl.RTNotUDP || rtr == rrl.RTCacheFull || rtr == rrl.RTLast
		switch action {
		case rrl.Drop:
			srv.dropped++
		case rrl.Send:
			srv.Send(false)
		case rrl.Slip:
			if req.cookie {
				srv.badCookies++
			} else {
				srv.Send(true)
			}
		case rrl.ActionLast:
		}
	}

	var total rrl.Stats
	stats := R.GetStats(true)
	total.Add(&stats)
	var cats [rrl.AllowanceLast]int64 = total.RPS
	var acts [rrl.ActionLast]int64 = total.Actions
	var iprs [rrl.IPLast]int64 = total.IPReasons
	var rtrs [rrl.RTLast]int64 = total.RTReasons
	_, _, _, _ = cats[rrl.AllowanceAnswer]+cats[rrl.AllowanceReferral]+cats[rrl.AllowanceNoData]+
		cats[rrl.AllowanceNXDomain]+cats[rrl.AllowanceError], acts, iprs, rtrs
	var length int = total.CacheLength
	var evictions int64 = total.Evictions
	_, _ = length, evictions
	_ = total.String()
	copied := total.Copy(false)
	var _ rrl.AllowanceCategory = rrl.AllowanceLast
	return srv, copied
}

func TestMarkdingoProgram(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var reqs []request
	for i := range 10 {
		reqs = append(reqs, request{src: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1000 + i}, cookie: i == 7})
	}
	srv, st := markdingoProgram(reqs, func() time.Time { return now })
	// 5 sent; then slip, drop, slip (with a cookie: BADCOOKIE), drop, slip.
	if srv.sent != 5 || srv.dropped != 2 || srv.truncated != 2 || srv.badCookies != 1 || st.CacheLength != 1 {
		t.Errorf("server %+v, stats %v", *srv, st)
	}
}
