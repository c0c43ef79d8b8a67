package rrl_test

import (
	"fmt"
	"net"
	"time"

	"github.com/dnsrake/rrl"
)

func ExampleNewConfig() {
	cfg := rrl.NewConfig() // BIND's defaults, limiting nothing yet
	fmt.Println(cfg.IsActive())
	cfg.SetValue("responses-per-second", "5")
	fmt.Println(cfg.IsActive())
	// Output:
	// false
	// true
}

func ExampleConfig_SetValue() {
	cfg := rrl.NewConfig()
	for _, kv := range [][2]string{
		{"responses-per-second", "5"},
		{"nxdomains-per-second", "2"},
		{"exempt-clients", "192.0.2.53, 2001:db8::/48"},
		{"slip-ratio", "11"}, // out of range: refused, slip-ratio stays 2
		{"windows", "30"},    // misspelt
	} {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// rrl: slip-ratio="11": must be between 0 and 10
	// rrl: windows="30": unknown keyword
}

func ExampleRRL_Debit() {
	cfg := rrl.NewConfig()
	cfg.SetValue("responses-per-second", "5")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg.SetNowFunc(func() time.Time { return now }) // a stopped clock, for the example
	limiter := rrl.NewRRL(cfg)

	// A burst of 60 identical queries "from" one client in the same instant, as a
	// spoofed amplification attack sends them.
	client := &net.UDPAddr{IP: net.ParseIP("192.0.2.1"), Port: 40000}
	tuple := &rrl.ResponseTuple{Class: 1, Type: 16, AllowanceCategory: rrl.AllowanceAnswer, SalientName: "example.test."}
	var sent, slipped, dropped int
	for range 60 {
		switch action, _, _ := limiter.Debit(client, tuple); action {
		case rrl.Send: // write the response
			sent++
		case rrl.Slip: // write it truncated (TC=1), so a real client retries over TCP
			slipped++
		case rrl.Drop: // write nothing
			dropped++
		}
	}
	fmt.Println(sent, "sent,", slipped, "slipped,", dropped, "dropped")

	// Over TCP the source cannot be spoofed: no response limit applies.
	action, _, reason := limiter.Debit(&net.TCPAddr{IP: client.IP, Port: 40001}, tuple)
	fmt.Println(action == rrl.Send, reason == rrl.RTNotUDP)

	// The burst overdrew the account by 11 seconds of credit (60 debits of 0.2 s
	// against one second); 12 seconds later it sends again.
	now = now.Add(12 * time.Second)
	action, _, _ = limiter.Debit(client, tuple)
	fmt.Println(action == rrl.Send)
	fmt.Println(limiter.GetStats(false))
	// Output:
	// 5 sent, 28 slipped, 27 dropped
	// true true
	// true
	// RPS 62/0/0/0/0 Actions 7/27/28 IPR 0/62/0/0/0/0/0 RTR 6/0/0/55/1/0 L=1/0
}
