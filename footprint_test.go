package rrl

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/dnsrake/rrl/internal/loadgen"
	"golang.org/x/sys/unix"
)

// TestFilterFootprint reports what the eBPF filter costs in kernel memory and checks
// that attaching it needs no net.core.optmem_max tuning: the socket option memory
// charged for the filter stays far below the default limit, and the maps stay within
// 1 MiB, shared by every socket of the Filter.
func TestFilterFootprint(t *testing.T) {
	requireBPF(t)
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	before, err := loadgen.Meminfo(srv.conn)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Attach(srv.conn, NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	after, err := loadgen.Meminfo(srv.conn)
	if err != nil {
		t.Fatal(err)
	}
	optmem := int(after[unix.SK_MEMINFO_OPTMEM]) - int(before[unix.SK_MEMINFO_OPTMEM])

	info, err := f.objs.Program.Info()
	if err != nil {
		t.Fatal(err)
	}
	jited, _ := info.JitedSize()
	insns, _ := info.TranslatedSize()
	var mapBytes uint64
	for name, m := range map[string]interface {
		ValueSize() uint32
		MaxEntries() uint32
	}{"cells": f.objs.Cells, "settings": f.objs.Settings} {
		b := uint64(m.ValueSize()) * uint64(m.MaxEntries())
		mapBytes += b
		t.Logf("map %s: %d bytes", name, b)
	}
	// The limited-groups LRU hash is preallocated: its entries (and the kernel's
	// per-entry overhead) come on top of the array maps.
	lru := uint64(f.objs.Limited.KeySize()+f.objs.Limited.ValueSize()) * uint64(f.objs.Limited.MaxEntries())
	t.Logf("map limited: %d entries, %d bytes of keys and values", f.objs.Limited.MaxEntries(), lru)
	t.Logf("socket option memory for the filter: %d bytes; program: %d bytes translated, %d bytes JIT-compiled; array maps: %d bytes (plus per-CPU counters and the exempt tries)",
		optmem, insns, jited, mapBytes)

	limit := 20480 // the kernel's default net.core.optmem_max before 6.9
	if b, err := os.ReadFile("/proc/sys/net/core/optmem_max"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			limit = min(limit, v)
		}
	}
	// The server cookie check (SipHash and the option lookup) took the program from
	// about 7.5 KB to about 12 KB, judging every packet the parser cannot follow and
	// XDP's skip of what XDP judged to 14 KB, and the rules that let it load with
	// CAP_BPF alone (global functions, immediate counter increments, SipHash's rounds
	// as calls) to about 15.5 KB; loaded by a process without CAP_PERFMON it is about
	// 1.2 KB larger again (the verifier's Spectre v1 masks). The kernel charges a new
	// filter before it releases the one it replaces (the classic prefilter Protect
	// attaches first, a few hundred bytes), so the program must leave room for that
	// and a socket's own options: 85% of the smallest default leaves 3 KB.
	if optmem < 0 || optmem > limit*85/100 {
		t.Errorf("filter charged %d bytes of socket option memory; want well under optmem_max %d", optmem, limit)
	}
	if mapBytes > 1<<20 {
		t.Errorf("maps take %d bytes, want at most 1 MiB", mapBytes)
	}
}
