package rrl

import "testing"

// BenchmarkDebitEvents is BenchmarkDebit's hot and 100k-accounts cases with limiting
// events on: the cost of following episodes when none starts or stops, and of debiting
// accounts that are being limited and followed.
func BenchmarkDebitEvents(b *testing.B) {
	withEvents := func(kv ...string) *RRL {
		cfg := NewConfig()
		for i := 0; i+1 < len(kv); i += 2 {
			if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
				b.Fatal(err)
			}
		}
		cfg.SetEventFunc(func(LimitEvent) {})
		return NewRRL(cfg)
	}
	b.Run("hot", func(b *testing.B) {
		r := withEvents("responses-per-second", "1000000")
		src := udpAddrs(1)[0]
		b.ReportAllocs()
		start := cpuTime()
		for b.Loop() {
			r.Debit(src, benchTuple)
		}
		reportCPU(b, start, 1)
	})
	b.Run("hot-limited", func(b *testing.B) {
		// One account over its limit the whole time: followed, counted per debit.
		r := withEvents("responses-per-second", "10")
		src := udpAddrs(1)[0]
		b.ReportAllocs()
		for b.Loop() {
			r.Debit(src, benchTuple)
		}
	})
	b.Run("100k-accounts", func(b *testing.B) {
		r := withEvents("responses-per-second", "10", "max-table-size", "200000")
		srcs := udpAddrs(100_000)
		for _, s := range srcs {
			r.Debit(s, benchTuple)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			r.Debit(srcs[i], benchTuple)
			if i++; i == len(srcs) {
				i = 0
			}
		}
	})
}
