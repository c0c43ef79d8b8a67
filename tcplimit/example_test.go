package tcplimit_test

import (
	"fmt"
	"net"
	"time"

	"github.com/dnsrake/rrl/tcplimit"
)

func ExampleLimitListener() {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	l := tcplimit.LimitListener(inner, 1) // one connection per client address
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := l.Accept() // a dns.Server with Listener: l does this
			if err != nil {
				return
			}
			accepted <- c
		}
	}()

	first, _ := net.Dial("tcp", l.Addr().String())
	defer first.Close()
	server := <-accepted

	// The client's second connection is reset at once.
	// (On loopback the reset may even beat the end of Dial.)
	if second, err := net.Dial("tcp", l.Addr().String()); err == nil {
		second.SetReadDeadline(time.Now().Add(5 * time.Second))
		second.Read(make([]byte, 1)) // returns the reset
		second.Close()
	}
	fmt.Printf("%+v\n", l.Stats())

	server.Close() // frees the client's slot
	fmt.Printf("%+v\n", l.Stats())
	// Output:
	// {Accepted:1 Refused:1 Open:1 Clients:1 Evicted:0 AcceptErrors:[0 0]}
	// {Accepted:1 Refused:1 Open:0 Clients:0 Evicted:0 AcceptErrors:[0 0]}
}
