//go:build linux

package rrl

import (
	"net"
	"testing"

	"github.com/dnsrake/rrl/internal/procsock"
)

// TestFilterRelease: Release frees the Filter but leaves its program on the socket,
// where Close takes it off.
func TestFilterRelease(t *testing.T) {
	requireBPF(t)
	for _, tc := range []struct {
		name string
		free func(*Filter) error
		want string
	}{
		{"Release", (*Filter).Release, procsock.EBPFFilter},
		{"Close", (*Filter).Close, procsock.NoFilter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			f, err := Attach(conn, NewConfig())
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.free(f); err != nil {
				t.Fatal(err)
			}
			if f.Mode() != ModeNone {
				t.Errorf("mode after %s: %v, want none", tc.name, f.Mode())
			}
			kind, err := procsock.AttachedFilter(conn)
			if err != nil {
				t.Fatal(err)
			}
			if kind != tc.want {
				t.Errorf("after %s the socket has %q, want %q", tc.name, kind, tc.want)
			}
			// Whatever Release left is the socket's now: a later Close of the
			// same Filter does not touch it.
			f.Close()
			if kind2, _ := procsock.AttachedFilter(conn); kind2 != kind {
				t.Errorf("a second Close changed the socket's filter from %q to %q", kind, kind2)
			}
		})
	}
}
