package rrl_test

import (
	"fmt"
	"net"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

// A server protected with one call: the best kernel filter the host allows, the
// request limits in Go where the eBPF filter is not in force, response rate limiting,
// cookies and the TCP connection limit.
func ExampleProtect() {
	zone := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
			A:   net.IPv4(192, 0, 2, 1),
		})
		w.WriteMsg(m)
	})
	cfg := rrl.NewConfig()
	cfg.SetValue("responses-per-second", "5")
	cfg.SetValue("requests-per-second", "50")

	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		panic(err)
	}
	p, err := rrl.Protect(udp, zone, cfg)
	if err != nil {
		panic(err) // only for an invalid Config or a socket that is not UDP
	}
	defer p.Close()
	// The Status line differs from host to host: "kernel filter: ebpf; request limits
	// in the kernel" as root, the classic filter and the reason without CAP_BPF.
	_ = p.Status()

	srv := p.UDPServer()
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	defer srv.Shutdown()
	<-started

	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(q, udp.LocalAddr().String())
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Answer[0])
	// Output: www.example.test.	300	IN	A	192.0.2.1
}
