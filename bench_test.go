package rrl

import (
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Benchmarks of Debit with *net.UDPAddr sources, as servers call it, on the default
// (coarse) clock. docs/performance.md quotes them; run them with
//
//	go test -run '^$' -bench 'Debit|TableMemory' -benchtime 2s -cpu 1,2 .

// cpuTime returns the CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports CPU time per operation since start as cpu-ns/op, per goroutine
// for parallel benchmarks. Unlike ns/op (wall time) it is not inflated by other
// processes competing for the cores, which on a shared machine can double ns/op.
func reportCPU(b *testing.B, start time.Duration, procs int) {
	_ = procs
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

func benchRRL(b *testing.B, kv ...string) *RRL {
	b.Helper()
	cfg := NewConfig()
	for i := 0; i+1 < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			b.Fatal(err)
		}
	}
	return NewRRL(cfg)
}

// udpAddrs returns n sources, each in its own /24.
func udpAddrs(n int) []*net.UDPAddr {
	out := make([]*net.UDPAddr, n)
	for i := range out {
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, 0x0a000000+uint32(i)<<8+1)
		out[i] = &net.UDPAddr{IP: ip, Port: 40000}
	}
	return out
}

// accounts100k returns an RRL (max-table-size 200000) holding an account for each
// of the 100,000 sources it returns, each in its own /24.
func accounts100k(b *testing.B) (*RRL, []*net.UDPAddr) {
	r := benchRRL(b, "responses-per-second", "10", "max-table-size", "200000")
	srcs := udpAddrs(100_000)
	for _, s := range srcs {
		r.Debit(s, benchTuple)
	}
	return r, srcs
}

var benchTuple = &ResponseTuple{Class: 1, Type: 1, AllowanceCategory: AllowanceAnswer, SalientName: "www.example.test."}

// setIP writes a distinct IPv4 /24 for n into ip (4 bytes).
func setIP(ip net.IP, n uint32) { binary.BigEndian.PutUint32(ip, 0x0b000000+n<<8) }

func BenchmarkDebit(b *testing.B) {
	b.Run("hot", func(b *testing.B) {
		r := benchRRL(b, "responses-per-second", "1000000")
		src := udpAddrs(1)[0]
		b.ReportAllocs()
		start := cpuTime()
		for b.Loop() {
			r.Debit(src, benchTuple)
		}
		reportCPU(b, start, 1)
	})
	b.Run("100k-accounts", func(b *testing.B) {
		r, srcs := accounts100k(b)
		b.ReportAllocs()
		i := 0
		start := cpuTime()
		for b.Loop() {
			r.Debit(srcs[i], benchTuple)
			if i++; i == len(srcs) {
				i = 0
			}
		}
		reportCPU(b, start, 1)
		b.ReportMetric(float64(r.GetStats(false).CacheLength), "accounts")
	})
	for _, size := range []int{100_000, 1 << 20} {
		b.Run(fmt.Sprintf("new-accounts-table-%d", size), func(b *testing.B) {
			// Each op creates an account for a new client network in a table of
			// max-table-size size, replaced by an empty one (off the clock) when
			// it is 15/16 full: the cost of filling a table from empty.
			newRRL := func() *RRL {
				return benchRRL(b, "responses-per-second", "10", "max-table-size", strconv.Itoa(size))
			}
			r := newRRL()
			src := &net.UDPAddr{IP: make(net.IP, 4), Port: 40000}
			b.ReportAllocs()
			n := 0
			evictions := int64(0)
			var cpu time.Duration
			start := cpuTime()
			for b.Loop() {
				setIP(src.IP, uint32(n))
				if n++; n%(size*15/16) == 0 {
					b.StopTimer()
					cpu += cpuTime() - start
					evictions += r.GetStats(false).Evictions
					r = newRRL()
					runtime.GC()
					start = cpuTime()
					b.StartTimer()
				}
				r.Debit(src, benchTuple)
			}
			cpu += cpuTime() - start
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
			evictions += r.GetStats(false).Evictions
			b.ReportMetric(float64(evictions)/float64(b.N), "evictions/op")
		})
	}
	b.Run("full-table-flood", func(b *testing.B) {
		r := benchRRL(b, "responses-per-second", "10", "max-table-size", "100000")
		src := &net.UDPAddr{IP: make(net.IP, 4), Port: 40000}
		n := uint32(0)
		for ; n < 200_000; n++ {
			setIP(src.IP, n)
			r.Debit(src, benchTuple)
		}
		b.ReportAllocs()
		start := cpuTime()
		for b.Loop() {
			setIP(src.IP, n)
			n++
			r.Debit(src, benchTuple)
		}
		reportCPU(b, start, 1)
		st := r.GetStats(false)
		b.ReportMetric(float64(st.CacheLength), "accounts")
	})
	b.Run("parallel-100k-accounts", func(b *testing.B) {
		r, srcs := accounts100k(b)
		var offset atomic.Uint32
		b.ReportAllocs()
		b.ResetTimer()
		start := cpuTime()
		defer func() { reportCPU(b, start, runtime.GOMAXPROCS(0)) }()
		b.RunParallel(func(pb *testing.PB) {
			i := int(offset.Add(7919)) % len(srcs)
			for pb.Next() {
				r.Debit(srcs[i], benchTuple)
				if i++; i == len(srcs) {
					i = 0
				}
			}
		})
	})
	b.Run("parallel-100k-accounts-own-clients", func(b *testing.B) {
		// As parallel-100k-accounts, but each goroutine serves its own share of
		// the clients, as cores do when each reads its own socket and a client
		// keeps to one of them: what is shared is the table, not the accounts.
		r, srcs := accounts100k(b)
		procs := runtime.GOMAXPROCS(0)
		var next atomic.Int32
		b.ReportAllocs()
		b.ResetTimer()
		start := cpuTime()
		defer func() { reportCPU(b, start, procs) }()
		b.RunParallel(func(pb *testing.PB) {
			k := int(next.Add(1)-1) % procs
			own := srcs[k*len(srcs)/procs : (k+1)*len(srcs)/procs]
			i := 0
			for pb.Next() {
				r.Debit(own[i], benchTuple)
				if i++; i == len(own) {
					i = 0
				}
			}
		})
	})
}

// BenchmarkTableMemory reports the heap the account table holds per account with
// one million accounts (one per client network) in a table sized for them.
func BenchmarkTableMemory(b *testing.B) {
	const accounts = 1_000_000
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := benchRRL(b, "responses-per-second", "10", "max-table-size", strconv.Itoa(1<<20))
		src := &net.UDPAddr{IP: make(net.IP, 4), Port: 40000}
		for n := range uint32(accounts) {
			setIP(src.IP, n)
			r.Debit(src, benchTuple)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		st := r.GetStats(false)
		if st.CacheLength < accounts*99/100 {
			b.Fatalf("only %d accounts kept", st.CacheLength)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(st.CacheLength), "B/account")
		runtime.KeepAlive(r)
	}
}
