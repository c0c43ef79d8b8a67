package main

import (
	"flag"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dnsrake/rrl"
)

// xdpCommand attaches the XDP program of a pinned filter to an interface, or
// detaches it. It is one command with two verbs, so that both share the help that
// says what XDP mode is.
var xdpCommand = &command{
	name:        "xdp",
	args:        "attach -dev IFACE -pin DIR [-mode native|generic] [-ports 53] [-addrs A,B] | detach -dev IFACE [-pin DIR]",
	summary:     "judge at the driver: attach or detach the XDP program (root)",
	pinOptional: true,
	help: `attach: judge UDP to the server's -ports (and -addrs, default every address)
arriving on IFACE with the filter pinned in DIR, at the driver (XDP), before
the kernel builds a socket buffer: the same limits, sketches and counters as the
socket filter, which then does not judge those packets again. A share of the
request-limited queries (slip-ratio) is answered there with a truncated response
(TC=1), so that resolvers retry over TCP. Everything else passes untouched.
-mode native (the default) falls back to generic mode, and says so, when the
driver has no native XDP. The attachment is pinned in DIR and outlives rrlctl;
rrl never replaces an XDP program someone else attached.

detach: remove rrl's XDP program from IFACE (and its pin from DIR; without
-pin, from the directory under /sys/fs/bpf that holds it).

Needs CAP_NET_ADMIN and CAP_BPF, as the owner of the pins (root). docs/xdp.md says
when XDP mode helps.`,
	run: runXDP,
}

func runXDP(c *cli, fs *flag.FlagSet, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			fs.Usage()
			return flag.ErrHelp
		}
		return usagef("attach or detach?")
	}
	verb := args[0]
	var dev, mode, ports, addrs string
	fs.StringVar(&dev, "dev", "", "the network `interface` (required)")
	switch verb {
	case "attach":
		fs.StringVar(&mode, "mode", "native", "`native` (falling back to generic) or generic")
		fs.StringVar(&ports, "ports", "53", "the server's UDP `ports`, comma-separated")
		fs.StringVar(&addrs, "addrs", "", "the server's `addresses`, comma-separated (default every address)")
	case "detach":
	default:
		return usagef("unknown verb %q: attach or detach", verb)
	}
	if err := c.parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if dev == "" {
		return usagef("-dev IFACE is required")
	}
	if verb == "detach" {
		pin := c.pin
		if pin == "" {
			pin = findXDPPin(dev)
		}
		if err := rrl.DetachXDP(pin, dev); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "detached rrl's XDP program from %s\n", dev)
		return nil
	}
	if c.pin == "" {
		return usagef("-pin DIR is required")
	}
	opts := &rrl.XDPOptions{}
	switch mode {
	case "native":
	case "generic":
		opts.Generic = true
	default:
		return usagef("-mode %q: native or generic", mode)
	}
	for _, p := range strings.Split(ports, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(p), 10, 16)
		if err != nil || n == 0 {
			return usagef("-ports %q: a port is 1 to 65535", ports)
		}
		opts.Ports = append(opts.Ports, uint16(n))
	}
	if addrs != "" {
		for _, a := range strings.Split(addrs, ",") {
			ip, err := netip.ParseAddr(strings.TrimSpace(a))
			if err != nil {
				return usagef("-addrs: %v", err)
			}
			opts.Addrs = append(opts.Addrs, ip)
		}
	}
	generic, err := rrl.AttachXDP(c.pin, dev, opts)
	if err != nil {
		return err
	}
	switch {
	case generic && !opts.Generic:
		fmt.Fprintf(c.stdout, "attached to %s in generic mode: its driver has no native XDP, so packets are judged after the kernel builds a socket buffer (less gain than native)\n", dev)
	case generic:
		fmt.Fprintf(c.stdout, "attached to %s in generic mode\n", dev)
	default:
		fmt.Fprintf(c.stdout, "attached to %s in native mode\n", dev)
	}
	return nil
}

// findXDPPin looks for the pin of dev's attachment in /sys/fs/bpf and the
// directories right under it, where pin directories usually are; "" when there is
// not exactly one.
func findXDPPin(dev string) string {
	var found []string
	for _, pattern := range []string{"/sys/fs/bpf/rrl_xdplink_" + dev, "/sys/fs/bpf/*/rrl_xdplink_" + dev} {
		m, _ := filepath.Glob(pattern)
		found = append(found, m...)
	}
	if len(found) != 1 {
		return ""
	}
	return filepath.Dir(found[0])
}
