// Command floodbench floods a UDP socket on loopback that rrl protects and measures,
// per 10 ms and per traffic group, what the server actually reads: legitimate DNS
// clients (real UDP sockets on ephemeral ports, minimal 17-byte and EDNS queries) and
// an attack from many 127.x.y.z sources, or with -ipv6 also from IPv6 sources inside
// a network namespace it creates and removes.
//
// As root it uses the eBPF filter and spoofs attack sources through a raw socket.
// Without root it uses the eBPF filter if the kernel permits, else the classic
// prefilter with the Go Limiter applied to every datagram read; attack sources are
// then UDP sockets bound to 127.x.y.z, at most a few hundred distinct ones. The mode
// is printed first.
//
//	sudo go run ./examples/floodbench -ipv6 -svg docs/floodbench.svg
//
// For every scenario it prints legitimate delivery, the attack's offered rate, its
// group's limit, what was admitted in steady state (from one second after the attack
// began) as a multiple of that limit, the time to converge (the centre of the first
// 200 ms window admitting the limit ±10%, the following 500 ms confirming it) and to
// release (likewise, the first window in which the group, back within its limit,
// gets at least 90% of what it sends), and datagrams lost to receive-queue overflow,
// which make a run not meaningful. -json writes all that and every 10 ms count.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/loadgen"
	"golang.org/x/sys/unix"
)

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "floodbench:", err)
		os.Exit(1)
	}
}

// options are the command line.
type options struct {
	scenario string
	duration time.Duration
	limit    float64
	ipv6     bool
	json     bool
	svg      string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("floodbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	var names []string
	for _, s := range scenarios {
		names = append(names, s.name)
	}
	fs.StringVar(&o.scenario, "scenario", "", "run only this scenario: "+strings.Join(names, ", "))
	fs.DurationVar(&o.duration, "duration", 4*time.Second, "length of each scenario (2s to 20s; start-stop runs 2s longer)")
	fs.Float64Var(&o.limit, "limit", 500, "requests-per-second (100 to 2500; attacks send up to 20 times this)")
	fs.BoolVar(&o.ipv6, "ipv6", false, "run every scenario over IPv6 too, inside a network namespace (root)")
	fs.BoolVar(&o.json, "json", false, "write the results as JSON instead of a table")
	fs.StringVar(&o.svg, "svg", "", "write a plot of delivered packets per second over time to this SVG file")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.duration < 2*time.Second || o.duration > 20*time.Second {
		return nil, fmt.Errorf("-duration %v: want 2s to 20s", o.duration)
	}
	// 20 times the limit stays well below what two cores send and read on loopback.
	if o.limit < 100 || o.limit > 2500 {
		return nil, fmt.Errorf("-limit %v: want 100 to 2500", o.limit)
	}
	if o.scenario != "" && selectScenarios(o.scenario) == nil {
		return nil, fmt.Errorf("-scenario %q: want one of %s", o.scenario, strings.Join(names, ", "))
	}
	return o, nil
}

func selectScenarios(name string) []scenario {
	if name == "" {
		return scenarios
	}
	for _, s := range scenarios {
		if s.name == name {
			return []scenario{s}
		}
	}
	return nil
}

// probe finds out which filter and which senders this process may use.
func probe() (mode string, raw bool, err error) {
	conn, err := listen(false)
	if err != nil {
		return "", false, err
	}
	defer conn.Close()
	f, err := rrl.Attach(conn, rrl.NewConfig())
	switch {
	case err == nil:
		mode = "ebpf"
	case errors.Is(err, rrl.ErrNotPermitted):
		mode = "classic+go"
	default:
		return "", false, err
	}
	f.Close()
	if r, err := loadgen.NewRawSender(conn.LocalAddr().(*net.UDPAddr).AddrPort()); err == nil {
		r.Close()
		raw = true
	}
	return mode, raw, nil
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// newGoLimiter makes the Go request limiter used when eBPF is not permitted.
func newGoLimiter(cfg *rrl.Config) (goLimiter, error) { return rrl.NewLimiter(cfg) }

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	mode, raw, err := probe()
	if err != nil {
		return err
	}
	desc := "eBPF request limiter in the kernel"
	if mode != "ebpf" {
		desc = "eBPF not permitted to this process: classic prefilter in the kernel + Go Limiter on every datagram read"
	}
	srcDesc := "spoofed through a raw socket"
	if !raw {
		srcDesc = "UDP sockets bound to 127.x.y.z (no CAP_NET_RAW: random sources come from a pool of 256)"
	}
	header := fmt.Sprintf("mode: %s (%s)\nattack sources: %s\nrequests-per-second %.0f, legitimate clients %d x %.0f pps\n",
		mode, desc, srcDesc, o.limit, legitClients, legitRate(o.limit))
	fmt.Fprint(stderr, header)

	var stop atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, unix.SIGTERM)
	defer signal.Stop(sig)
	go func() {
		if _, ok := <-sig; ok {
			stop.Store(true)
		}
	}()

	envs := []*env{{L: o.limit, d: o.duration, raw: raw, stop: &stop}}
	if o.ipv6 {
		if !raw {
			return errors.New("-ipv6 needs root: spoofed IPv6 sources are sent through a raw socket inside a network namespace")
		}
		ns, err := loadgen.NewNetns("floodbench")
		if err != nil {
			return err
		}
		defer ns.Close()
		// The legitimate clients bind real sockets: their addresses must exist.
		src := newSources(true, 0, 0)
		for i := range legitClients {
			if err := ns.AddAddress(src.legit(i)); err != nil {
				return err
			}
		}
		envs = append(envs, &env{v6: true, ns: ns, L: o.limit, d: o.duration, raw: true, stop: &stop})
	}

	sel := selectScenarios(o.scenario)
	total := len(sel) * len(envs)
	tty := false
	if f, ok := stderr.(*os.File); ok {
		tty = isTerminal(f)
	}
	var results []*Result
	n := 0
	for _, e := range envs {
		for _, sc := range sel {
			n++
			if stop.Load() {
				break
			}
			if tty {
				e.progress = func(elapsed, length time.Duration, pps [numGroups]float64) {
					var rates []string
					for g, r := range pps {
						rates = append(rates, fmt.Sprintf("%s %5.0f pps", groupNames[g], r))
					}
					fmt.Fprintf(stderr, "\r\033[K%s", progressLine(n, total, sc.name, e.family(), elapsed, length, rates))
				}
			} else {
				fmt.Fprintf(stderr, "[%d/%d] %s/%s\n", n, total, sc.name, e.family())
			}
			r, err := e.run(sc, newGoLimiter)
			if tty {
				fmt.Fprint(stderr, "\r\033[K")
			}
			if errors.Is(err, errInterrupted) {
				break
			}
			if err != nil {
				return fmt.Errorf("%s/%s: %w", sc.name, e.family(), err)
			}
			results = append(results, r)
		}
	}
	if o.svg != "" && len(results) > 0 {
		if err := writeSVG(o.svg, results); err != nil {
			return err
		}
	}
	if o.json {
		err = writeJSON(stdout, mode, results)
	} else {
		fmt.Fprint(stdout, header)
		err = writeTable(stdout, results)
	}
	if err == nil && stop.Load() {
		err = errInterrupted
	}
	return err
}
