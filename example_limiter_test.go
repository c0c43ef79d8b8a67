package rrl_test

import (
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/dnsrake/rrl"
)

// A server without the kernel filter calls Allow with each query's source right after
// reading it, and drops the query when Allow says so.
func ExampleLimiter_Allow() {
	cfg := rrl.NewConfig()
	if err := cfg.SetValue("requests-per-second", "100"); err != nil {
		log.Fatal(err)
	}
	limiter, err := rrl.NewLimiter(cfg)
	if err != nil {
		log.Fatal(err)
	}

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client, err := net.DialUDP("udp", nil, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Write([]byte("a query")); err != nil {
		log.Fatal(err)
	}

	// The server's read loop, once round.
	buf := make([]byte, 1232)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, src, err := conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		log.Fatal(err)
	}
	if !limiter.Allow(src) {
		return // over a limit: no parsing, no response
	}
	fmt.Printf("serving %q\n", buf[:n])
	// Output: serving "a query"
}

// The Limiter on a simulated clock: a source flooding at ten times the limit is
// trimmed to the limit, while a client in another network is untouched.
func ExampleLimiter_AllowAt() {
	cfg := rrl.NewConfig()
	if err := cfg.SetValue("requests-per-second", "100"); err != nil {
		log.Fatal(err)
	}
	limiter, err := rrl.NewLimiter(cfg)
	if err != nil {
		log.Fatal(err)
	}
	flood := netip.MustParseAddrPort("198.51.100.7:40000")
	client := netip.MustParseAddrPort("192.0.2.1:53000")
	r := rand.New(rand.NewPCG(1, 2)) // seeded draws: a reproducible run

	floodPassed, clientPassed := 0, 0
	for ms := range 10_000 { // 10 s: the flood at 1000 pps, the client at 10 pps
		now := int64(ms) * int64(time.Millisecond)
		if limiter.AllowAt(flood, now, r.Uint32()) && ms >= 1000 {
			floodPassed++ // counted after the first second
		}
		if ms%100 == 0 && limiter.AllowAt(client, now, r.Uint32()) {
			clientPassed++
		}
	}
	fmt.Printf("flood: about %d per second passed\n", (floodPassed/9+5)/10*10)
	fmt.Printf("client: %d of 100 passed\n", clientPassed)
	// Output:
	// flood: about 100 per second passed
	// client: 100 of 100 passed
}
