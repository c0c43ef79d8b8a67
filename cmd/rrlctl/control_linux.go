package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/procsock"
	"golang.org/x/sys/unix"
)

// controlSignals end rrlctl control; tests send them to their own process.
var controlSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

var controlCommand = &command{
	name:        "control",
	args:        "[-pid PID -listen ADDR:PORT] [-pin DIR] [-interval 1s]",
	summary:     "run the capacity controller of a pinned filter (long-running)",
	pinOptional: true,
	help: `Run the capacity controller (configuration keyword capacity: auto or queries per
second) of the filter pinned in DIR until SIGINT or SIGTERM. A pinned filter
runs no controller by itself: without one, capacity limits nothing (the
static limits, requests-per-second, stay in force).

With -pid and -listen it samples the receive queues of every UDP socket process
PID has bound to ADDR:PORT (an SO_REUSEPORT group included; copies taken with
pidfd_getfd, so root or CAP_SYS_PTRACE over PID is needed), the sockets "rrlctl
attach" put the filter on (one without an eBPF filter is reported and not
sampled). With "capacity auto" the queues are what it measures the server's
capacity from; with a configured capacity it works from the filter's counters
alone, and -pid may be left out. When the server's sockets change (a reload
that reopens them), it stops, lifting its level, lets go of its copies of the
old ones (a copy would keep a socket the server closed bound) and starts again
over the new ones. It exits when process PID does: a restarted server has new
sockets (run "rrlctl attach" and this command again with its new PID; with
systemd, bind the unit to the server's).

It follows the capacity keyword and the limits stored in DIR ("rrlctl set"
takes effect at the next sample), writes the water level into the pinned
settings for every process attached to them, publishes its status for "rrlctl
stats", and prints a line when an overload starts or ends or a problem appears.
One controller runs per pin directory (it holds an flock on DIR): a second
one, or a server running one (rrl.Filter.RunCapacity), makes this command fail.
On SIGINT or SIGTERM it lifts the water level (the static limits stay) and exits
0. Killed otherwise (SIGKILL, a crash), it leaves its last level in force until
a controller starts again (which lifts it first) or "rrlctl set" writes the
settings; "rrlctl stats" says so. Needs write access to the pins.`,
	run: func(c *cli, fs *flag.FlagSet, args []string) error {
		var t targetFlags
		t.define(fs)
		fs.Lookup("pid").Usage = "the server's process `id`, whose sockets on -listen are sampled (optional with a configured capacity)"
		fs.Lookup("listen").Usage = "the server's UDP `address:port` (0.0.0.0 or [::] for every address on the port; with -pid)"
		interval := fs.Duration("interval", 250*time.Millisecond, "how often to check the controller's state and the server's sockets, and print changes")
		if err := c.parseFlags(fs, args); err != nil {
			return err
		}
		if *interval < 10*time.Millisecond {
			return usagef("-interval %v: want at least 10ms", *interval)
		}
		if t.pid != 0 || t.listen != "" {
			if err := t.check(c); err != nil {
				return err
			}
		} else if c.pin == "" {
			return usagef("-pin DIR, or -pid PID -listen ADDR:PORT, is required")
		}
		f, err := rrl.OpenPinned(c.pin)
		if err != nil {
			return err
		}
		defer f.Close()
		var w *watched
		var exited <-chan struct{}
		if t.pid != 0 {
			if w, err = watch(c, t); err != nil {
				return err
			}
			defer func() { w.close() }() // the last set of copies
			if exited, err = processExit(t.pid); err != nil {
				return err
			}
		}
		exitedErr := fmt.Errorf("process %d exited; the water level is lifted, the static limits are in force", t.pid)
		exitCh := exited
		ctx, stop := signal.NotifyContext(context.Background(), controlSignals...)
		defer stop()
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		capacity := "off"
		for _, kv := range f.Config().Values() {
			if kv[0] == "capacity" && kv[1] != "" && kv[1] != "0" {
				capacity = kv[1]
			}
		}
		fmt.Fprintf(c.stdout, "controlling the capacity of %s (capacity %s) from %s\n", c.pin, capacity, w.describe())
		tick := time.NewTicker(*interval)
		defer tick.Stop()
		var last rrl.CapacityStats
		for {
			// One run of the controller per set of sockets: when the server's
			// sockets change, it stops (lifting its level), the copies of the old
			// ones are closed (a copy would keep a closed socket bound), and it
			// starts again over the new ones.
			runCtx, runCancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- f.RunCapacity(runCtx, w.conns()...) }()
			restart := false
			for !restart {
				select {
				case err := <-done:
					runCancel()
					if err == nil {
						if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
							err = cause
						} else {
							fmt.Fprintf(c.stdout, "stopped: the water level is lifted, the static limits are in force\n")
						}
					}
					return err
				case <-exited:
					exited = nil
					cancel(exitedErr)
				case <-tick.C:
					if w != nil && w.changed() {
						runCancel()
						if err := <-done; err != nil {
							return err
						}
						w.close()
						if w, err = watch(c, t); err != nil {
							select {
							case <-exitCh: // the server closed its sockets as it exited
								return exitedErr
							case <-time.After(time.Second):
							}
							return err
						}
						fmt.Fprintf(c.stdout, "%s the sockets of process %d changed: now %s\n", time.Now().Format(time.DateTime), t.pid, w.describe())
						restart = true
						continue
					}
					st, err := f.Stats()
					if err != nil || st.Capacity == nil {
						continue
					}
					reportCapacity(c, &last, *st.Capacity)
				}
			}
		}
	},
}

// watched are the copies of a server's sockets the controller samples.
type watched struct {
	pid    int
	local  netip.AddrPort
	copies []*procsock.Conn
	socks  []procsock.Socket // the sockets with an eBPF filter, copied
	seen   map[uint64]bool   // the inodes of every matching socket at the copy
	// bare are copies of the sockets without the eBPF filter, kept to see when it
	// comes (a server that binds, then attaches; rrlctl attach run again).
	bare []*procsock.Conn
}

// watch copies the sockets of t.pid bound to t.local that carry an eBPF filter; it
// warns about the others, which the filter is not on. A server with no matching
// socket left has none watched.
func watch(c *cli, t targetFlags) (*watched, error) {
	w := &watched{pid: t.pid, local: t.local, seen: map[uint64]bool{}}
	copies, socks, err := procsock.Copy(t.pid, t.local)
	if errors.Is(err, procsock.ErrNoSocket) {
		return w, nil
	}
	if err != nil {
		return nil, err
	}
	for i, k := range copies {
		w.seen[socks[i].Inode] = true
		kind, err := procsock.AttachedFilter(k)
		if err == nil && kind == procsock.EBPFFilter {
			w.copies, w.socks = append(w.copies, k), append(w.socks, socks[i])
			continue
		}
		if err == nil {
			err = fmt.Errorf("no eBPF filter (%s): run rrlctl attach again", kind)
		}
		fmt.Fprintf(c.stderr, "rrlctl control: %s not watched: %v\n", describe(socks[i:i+1]), err)
		w.bare = append(w.bare, k)
	}
	return w, nil
}

// conns returns the copies to sample (none for no server).
func (w *watched) conns() []syscall.Conn {
	if w == nil {
		return nil
	}
	out := make([]syscall.Conn, len(w.copies))
	for i, k := range w.copies {
		out[i] = k
	}
	return out
}

// changed reports whether the server's matching sockets differ from those copied.
func (w *watched) changed() bool {
	socks, err := procsock.UDP(w.pid, w.local)
	if err != nil && !errors.Is(err, procsock.ErrNoSocket) {
		return false // the process is going; processExit tells
	}
	if len(socks) != len(w.seen) {
		return true
	}
	for _, s := range socks {
		if !w.seen[s.Inode] {
			return true
		}
	}
	for _, k := range w.bare {
		if kind, err := procsock.AttachedFilter(k); err == nil && kind == procsock.EBPFFilter {
			return true
		}
	}
	return false
}

func (w *watched) close() {
	if w != nil {
		closeAll(w.copies)
		closeAll(w.bare)
		w.copies, w.bare = nil, nil
	}
}

func (w *watched) describe() string {
	switch {
	case w == nil:
		return "no socket"
	case len(w.socks) == 0:
		return fmt.Sprintf("no socket of process %d (none on %s carries the filter)", w.pid, w.local)
	}
	return fmt.Sprintf("%d socket(s) of process %d: %s", len(w.socks), w.pid, describe(w.socks))
}

// reportCapacity prints what changed from last to cur: an overload's start or end,
// a problem appearing or going.
func reportCapacity(c *cli, last *rrl.CapacityStats, cur rrl.CapacityStats) {
	now := time.Now().Format(time.DateTime)
	switch {
	case cur.Problem != last.Problem && cur.Problem != "":
		fmt.Fprintf(c.stdout, "%s problem: %s\n", now, cur.Problem)
	case cur.Problem != last.Problem:
		fmt.Fprintf(c.stdout, "%s problem solved\n", now)
	}
	switch {
	case cur.Overloaded && !last.Overloaded:
		fmt.Fprintf(c.stdout, "%s overload: capacity %.0f/s, demand %.0f/s, water level %.4g/s\n", now, cur.Capacity, cur.Demand, cur.Level)
	case !cur.Overloaded && last.Overloaded:
		fmt.Fprintf(c.stdout, "%s overload over: limits lifted (capacity %.0f/s)\n", now, cur.Capacity)
	}
	*last = cur
}

// processExit returns a channel closed when process pid exits.
func processExit(pid int) (<-chan struct{}, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	ch := make(chan struct{})
	go func() {
		defer unix.Close(pidfd)
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, -1)
			if err == nil && n > 0 || err != nil && !errors.Is(err, unix.EINTR) {
				close(ch)
				return
			}
		}
	}()
	return ch, nil
}
