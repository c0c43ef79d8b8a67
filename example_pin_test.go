package rrl_test

import (
	"fmt"
	"log"
	"net"

	"github.com/dnsrake/rrl"
)

// A Config's keyword and value pairs: what a pinned filter stores, and what
// `rrlctl config` prints.
func ExampleConfig_Values() {
	cfg := rrl.NewConfig()
	cfg.SetValue("requests-per-second", "50")
	cfg.SetValue("exempt-clients", "192.0.2.1, 2001:db8::/48")
	for _, kv := range cfg.Values() {
		if kv[0] == "requests-per-second" || kv[0] == "exempt-clients" || kv[0] == "ipv4-request-levels" {
			fmt.Printf("%s %q\n", kv[0], kv[1])
		}
	}
	// Output:
	// requests-per-second "50"
	// exempt-clients "192.0.2.1/32 2001:db8::/48"
	// ipv4-request-levels "32:1 16:16"
}

// A privileged step (here in Go; or `rrlctl load -pin /sys/fs/bpf/rrl -group dns
// -requests-per-second 50`) loads the filter for the group the server runs in: the
// pins are root's, with access for gid 53's members.
func ExampleLoadPinned() {
	cfg := rrl.NewConfig()
	cfg.SetValue("requests-per-second", "50")
	if err := rrl.LoadPinned(cfg, "/sys/fs/bpf/rrl", -1, 53); err != nil {
		log.Fatal(err)
	}
}

// The unprivileged server attaches the pinned filter to its own socket.
func ExampleAttachPinned() {
	conn, err := net.ListenUDP("udp", &net.UDPAddr{Port: 53})
	if err != nil {
		log.Fatal(err)
	}
	f, err := rrl.AttachPinned(conn, "/sys/fs/bpf/rrl")
	if err != nil {
		log.Fatal(err) // errors.Is(err, rrl.ErrNotPermitted), rrl.ErrLayoutMismatch, ...
	}
	defer f.Close()
	// Serve on conn: the kernel drops each source group's excess before it is read.
}
