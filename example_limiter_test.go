package rrl_test

import (
	"fmt"
	"log"
	"net"
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
