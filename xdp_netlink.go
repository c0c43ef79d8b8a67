//go:build linux

package rrl

import (
	"encoding/binary"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// xdpAttachedProgram returns the ID of the XDP program attached to interface index
// ifindex in the calling thread's network namespace (0: none), as the kernel reports
// it with the link (RTM_GETLINK, IFLA_XDP): the one answer that covers programs
// attached through netlink as well as through links, and that names the interface
// of this namespace, not an interface of the same index in another (link info gives
// the index alone).
func xdpAttachedProgram(ifindex int) (uint32, error) {
	rib, err := syscall.NetlinkRIB(unix.RTM_GETLINK, unix.AF_UNSPEC)
	if err != nil {
		return 0, fmt.Errorf("rrl: XDP: list interfaces: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return 0, fmt.Errorf("rrl: XDP: list interfaces: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWLINK || len(m.Data) < unix.SizeofIfInfomsg {
			continue
		}
		if int(int32(binary.NativeEndian.Uint32(m.Data[4:8]))) != ifindex {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			return 0, fmt.Errorf("rrl: XDP: interface %d: %w", ifindex, err)
		}
		for _, a := range attrs {
			if a.Attr.Type&^unix.NLA_F_NESTED != unix.IFLA_XDP {
				continue
			}
			// Nested attributes: length, type, value padded to 4 bytes.
			for b := a.Value; len(b) >= 4; {
				l, t := int(binary.NativeEndian.Uint16(b)), binary.NativeEndian.Uint16(b[2:])
				if l < 4 || l > len(b) {
					break
				}
				if t == unix.IFLA_XDP_PROG_ID && l >= 8 {
					return binary.NativeEndian.Uint32(b[4:8]), nil
				}
				b = b[min((l+3)&^3, len(b)):]
			}
		}
		return 0, nil
	}
	return 0, fmt.Errorf("rrl: XDP: interface %d is gone", ifindex)
}
