package rrl_test

import (
	"encoding/binary"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl"
)

// BenchmarkDebitAPI measures Debit as a user comparing libraries does: through the
// exported API only (NewConfig, SetValue, NewRRL, Debit, GetStats), with
// *net.UDPAddr sources, no event function, the default clock and whatever
// GOMAXPROCS the run gives. It uses nothing that c69352b lacks, so that
// scripts/bench-debit-vs.sh builds this same file against a base commit and both
// sides run the same code. docs/performance.md quotes it.
//
// Besides ns/op and allocs/op (which must stay 0) it reports cpu-ns/op (the
// process's CPU time per call, which waiting for a CPU does not inflate), the share
// of calls limited (which depends on the speed: accounts debited more often than
// responses-per-second are limited) and evictions per call, so that two runs that
// took different paths through Debit can be told apart.
func BenchmarkDebitAPI(b *testing.B) {
	b.Run("hot", func(b *testing.B) {
		r := apiRRL(b, "responses-per-second", "10")
		debitAPI(b, r, apiSources(1))
	})
	b.Run("100k-accounts", func(b *testing.B) {
		// 100,000 accounts round robin in a table with room for them all.
		r := apiRRL(b, "responses-per-second", "10", "max-table-size", "200000")
		srcs := apiSources(100_000)
		for _, s := range srcs {
			r.Debit(s, apiTuple)
		}
		debitAPI(b, r, srcs)
	})
	b.Run("100k-accounts-default-table", func(b *testing.B) {
		// The same with the default max-table-size (100000): the accounts do not
		// all fit in their shards, and the shards that overflow evict on most calls.
		r := apiRRL(b, "responses-per-second", "10")
		srcs := apiSources(100_000)
		for _, s := range srcs {
			r.Debit(s, apiTuple)
		}
		debitAPI(b, r, srcs)
	})
	b.Run("full-table-flood", func(b *testing.B) {
		// A new spoofed /24 per call against a full 100,000-account table: an
		// eviction per call. The sources are made beforehand (off the clock) and
		// used once each, in order.
		r := apiRRL(b, "responses-per-second", "10", "max-table-size", "100000")
		fill := apiSources(200_000)
		for _, s := range fill {
			r.Debit(s, apiTuple)
		}
		srcs := make([]*net.UDPAddr, 1<<20)
		for i := range srcs {
			ip := make(net.IP, 4)
			binary.BigEndian.PutUint32(ip, 0x0b000000+uint32(i)<<8+1)
			srcs[i] = &net.UDPAddr{IP: ip, Port: 40000}
		}
		debitAPI(b, r, srcs)
	})
}

var apiTuple = &rrl.ResponseTuple{Class: 1, Type: 1, AllowanceCategory: rrl.AllowanceAnswer, SalientName: "www.example.test."}

func apiRRL(b *testing.B, kv ...string) *rrl.RRL {
	b.Helper()
	cfg := rrl.NewConfig()
	for i := 0; i+1 < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			b.Fatal(err)
		}
	}
	return rrl.NewRRL(cfg)
}

// apiSources returns n sources, each in its own /24 of 10.0.0.0/8.
func apiSources(n int) []*net.UDPAddr {
	out := make([]*net.UDPAddr, n)
	for i := range out {
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, 0x0a000000+uint32(i)<<8+1)
		out[i] = &net.UDPAddr{IP: ip, Port: 40000}
	}
	return out
}

// debitAPI debits srcs round robin, one per op, and reports what BenchmarkDebitAPI
// says.
func debitAPI(b *testing.B, r *rrl.RRL, srcs []*net.UDPAddr) {
	before := r.GetStats(false)
	b.ReportAllocs()
	i := 0
	start := apiCPUTime()
	for b.Loop() {
		r.Debit(srcs[i], apiTuple)
		if i++; i == len(srcs) {
			i = 0
		}
	}
	b.ReportMetric(float64(apiCPUTime()-start)/float64(b.N), "cpu-ns/op")
	after := r.GetStats(false)
	limited := after.RTReasons[rrl.RTRateLimit] - before.RTReasons[rrl.RTRateLimit]
	b.ReportMetric(float64(limited)/float64(b.N), "limited/op")
	b.ReportMetric(float64(after.Evictions-before.Evictions)/float64(b.N), "evictions/op")
}

func apiCPUTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
