package rrl_test

import (
	"errors"
	"fmt"
	"log"
	"net"

	"github.com/dnsrake/rrl"
)

// Protect a server's UDP socket: with CAP_BPF the eBPF request limiter runs in the
// kernel; without it Attach keeps the classic prefilter and the server limits
// requests in Go with a Limiter.
func ExampleAttach() {
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	cfg := rrl.NewConfig()
	cfg.SetValue("requests-per-second", "50")
	filter, err := rrl.Attach(conn, cfg)
	var limiter *rrl.Limiter // nil while the kernel does the work
	switch {
	case errors.Is(err, rrl.ErrNotPermitted), errors.Is(err, rrl.ErrOptMem):
		log.Printf("rrl: %v", err) // says how to get the eBPF filter
		if limiter, err = rrl.NewLimiter(cfg); err != nil {
			log.Fatal(err)
		}
	case err != nil:
		log.Fatal(err)
	}
	defer filter.Close()

	fmt.Println("protected:", filter.Mode() == rrl.ModeEBPF || limiter != nil)
	// The read loop then discards what the Limiter refuses:
	//	n, src, _ := conn.ReadFromUDPAddrPort(buf)
	//	if limiter != nil && !limiter.Allow(src) { continue }

	// Output: protected: true
}
