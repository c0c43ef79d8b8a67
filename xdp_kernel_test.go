//go:build linux

package rrl

import (
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// XDP actions.
const (
	xdpAborted = iota
	xdpDrop
	xdpPass
	xdpTX
)

// xdpSlips is slips in xdp_bpf.c: whether a refusal with draw rnd is answered with
// a truncated response at slip-ratio ratio.
func xdpSlips(rnd uint32, ratio int) bool {
	return ratio != 0 && uint64(rnd>>8&0xffff)*uint64(ratio) < 0x10000
}

// xdpTestObjects are the XDP programs loaded with the maps of a socket filter's
// test objects.
type xdpTestObjects struct {
	Program *ebpf.Program `ebpf:"rrl_xdp"`
	Test    *ebpf.Program `ebpf:"rrl_xdp_test"`
}

// loadXDPTest loads the XDP programs with the maps of objs and lists UDP port 53
// of the loopback interface, where BPF_PROG_TEST_RUN says XDP frames arrive, as
// judged by XDP.
func loadXDPTest(t testing.TB, objs *testObjects) *xdpTestObjects {
	t.Helper()
	spec, err := xdpSpec([]uint16{53}, true)
	if err != nil {
		t.Fatal(err)
	}
	repl := map[string]*ebpf.Map{
		"rrl_cells": objs.Cells, "rrl_settings": objs.Settings, "rrl_counters": objs.Counters,
		"rrl_exempt4": objs.Exempt4, "rrl_exempt6": objs.Exempt6, "rrl_cookie_secrets": objs.Secrets,
		"rrl_limited": objs.Limited, "rrl_xdp_dests": objs.XDPDests, "rrl_xdp_state": objs.XDPState,
		"rrl_test_input": objs.TestInput, "rrl_names": objs.Names, "rrl_apexes": objs.Apexes,
	}
	var x xdpTestObjects
	if err := spec.LoadAndAssign(&x, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		t.Fatalf("load XDP test objects: %v", err)
	}
	t.Cleanup(func() { x.Program.Close(); x.Test.Close() })
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	a := &xdpAttachment{dests: objs.XDPDests, state: objs.XDPState}
	if err := a.addDests(lo.Index, []uint16{53}, nil); err != nil {
		t.Fatal(err)
	}
	return &x
}

// TestKernelXDPSlipResponse: a refused query slips as a truncated response built in
// place (addresses, ports and MACs swapped, QR and TC set, the question echoed and
// nothing else, never longer than the query, checksums valid), and a query the
// response cannot be built for is dropped instead; queries XDP does not judge pass.
func TestKernelXDPSlipResponse(t *testing.T) {
	objs := loadTestObjects(t)
	x := loadXDPTest(t, objs)
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "1")
	cfg.SetValue("slip-ratio", "1")
	if err := objs.settingsMaps().apply(cfg, 7, nil); err != nil {
		t.Fatal(err)
	}
	q := new(dns.Msg)
	q.SetQuestion("www.example.com.", dns.TypeA)
	q.SetEdns0(1232, false)
	q.Id = 4242
	query, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	src4, dst4 := netip.MustParseAddrPort("192.0.2.7:40000"), netip.MustParseAddrPort("192.0.2.53:53")
	src6, dst6 := netip.MustParseAddrPort("[2001:db8::7]:40000"), netip.MustParseAddrPort("[2001:db8::53]:53")
	cases := []struct {
		name string
		pkt  []byte
		want uint32 // once over the limit
	}{
		{"IPv4", ipv4Packet(src4, dst4, nil, query), xdpTX},
		{"IPv6", ipv6Packet(src6, dst6, false, query), xdpTX},
		{"IPv4 with options", ipv4Packet(src4, dst4, []byte{1, 1, 1, 0}, query), xdpDrop},
		{"IPv6 with a destination options header", ipv6Packet(src6, dst6, true, query), xdpDrop},
		{"another port", ipv4Packet(src4, netip.MustParseAddrPort("192.0.2.53:5353"), nil, query), xdpPass},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			etype := uint16(unix.ETH_P_IP)
			if c.pkt[0]>>4 == 6 {
				etype = unix.ETH_P_IPV6
			}
			frame := ethFrame(etype, c.pkt)
			copy(frame[0:6], []byte{2, 0, 0, 0, 0, 1})
			copy(frame[6:12], []byte{2, 0, 0, 0, 0, 2})
			// A new clock for each case: the source starts within its limit.
			now := uint64(i+1) * 100e9
			var ret uint32
			var out []byte
			for n := 0; n < 50; n++ {
				if err := objs.TestInput.Put(uint32(0), &filterTestInput{Now: now, Rnd: 0xffffff00}); err != nil {
					t.Fatal(err)
				}
				out = make([]byte, len(frame)+64)
				opts := &ebpf.RunOptions{Data: frame, DataOut: out}
				if ret, err = x.Test.Run(opts); err != nil {
					t.Fatal(err)
				}
				out = opts.DataOut
				if ret != xdpPass {
					break
				}
			}
			if ret != c.want {
				t.Fatalf("action %d, want %d", ret, c.want)
			}
			if ret != xdpTX {
				return
			}
			if string(out[0:6]) != string(frame[6:12]) || string(out[6:12]) != string(frame[0:6]) {
				t.Errorf("MACs not swapped: % x", out[:12])
			}
			if len(out) > len(frame) {
				t.Errorf("response frame of %d bytes for a query of %d", len(out), len(frame))
			}
			c := &tcCapture{replies: map[netip.AddrPort]int{}}
			srv, dst := dst4, src4
			if etype == unix.ETH_P_IPV6 {
				srv, dst = dst6, src6
			}
			c.check(out, srv, query)
			for _, b := range c.bad {
				t.Error(b)
			}
			if c.replies[dst] != 1 {
				t.Errorf("no valid truncated response to %v in % x", dst, out)
			}
			off := 14 + 40 + 8
			if etype == unix.ETH_P_IP {
				off = 14 + 20 + 8
			}
			m := new(dns.Msg)
			if err := m.Unpack(out[off:]); err != nil || m.Id != q.Id {
				t.Errorf("response ID %d (%v), want the query's %d", m.Id, err, q.Id)
			}
		})
	}
}
