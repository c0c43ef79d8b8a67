package rrl

import "net/netip"

// XDPOptions says where and how AttachXDP judges packets.
type XDPOptions struct {
	// Generic attaches in generic (skb) mode, which every driver has but which
	// runs after the kernel has built a socket buffer. Otherwise AttachXDP attaches
	// in native (driver) mode and falls back to generic mode, saying so, when the
	// driver has no native XDP.
	Generic bool
	// Ports are the server's UDP ports: only UDP to them is judged, everything
	// else passes untouched. Nil means 53.
	Ports []uint16
	// Addrs are the server's addresses on the interface; nil means every
	// destination address.
	Addrs []netip.Addr
}
