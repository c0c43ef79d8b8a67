//go:build linux

package rrl

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/testutil"
)

// The capacity mode live while the capped server's speed changes under a flood:
// a CPU burner moves into its cgroup for 1.5 s, three times; its quota
// doubles; its quota halves. The test asserts what holds on a loaded machine (light
// /24s kept from 2 s after the last change, the limits lifting after the flood);
// BenchmarkLiveCapacityChanges reports what the server answered against its C.

// capChange is one scenario: when the speed changes, and what the server's C is
// after the last change, as a share of the C measured before.
type capChange struct {
	name   string
	last   time.Duration // the last change
	factor float64
	apply  func(tb testing.TB, l *capLive, at func(time.Duration)) // runs the changes, waiting with at
}

var capChanges = []capChange{
	{"burner", 6500 * time.Millisecond, 1, func(tb testing.TB, l *capLive, at func(time.Duration)) {
		for _, from := range []time.Duration{1500 * time.Millisecond, 3500 * time.Millisecond, 5 * time.Second} {
			at(from)
			// A busy loop in the server's cgroup takes half of its quota (both
			// are one thread).
			burner := exec.Command("sh", "-c", "while :; do :; done")
			if err := burner.Start(); err != nil {
				tb.Error(err)
				return
			}
			if err := os.WriteFile(filepath.Join(l.cgroup, "cgroup.procs"), []byte(strconv.Itoa(burner.Process.Pid)), 0); err != nil {
				tb.Error(err)
			}
			at(from + 1500*time.Millisecond)
			burner.Process.Kill()
			burner.Wait()
		}
	}},
	{"quota doubles", 2500 * time.Millisecond, 2, func(tb testing.TB, l *capLive, at func(time.Duration)) {
		at(2500 * time.Millisecond)
		l.setShare(tb, 2)
	}},
	{"quota halves", 2500 * time.Millisecond, 0.5, func(tb testing.TB, l *capLive, at func(time.Duration)) {
		at(2500 * time.Millisecond)
		l.setShare(tb, 0.5)
	}},
}

// setShare sets the server's CPU share to factor times the test's quota, by its
// period (the kernel takes no quota under 1 ms, half of 1.5 ms).
func (l *capLive) setShare(tb testing.TB, factor float64) {
	period := strconv.Itoa(int(capPeriodMicros / factor))
	if err := os.WriteFile(filepath.Join(l.cgroup, "cpu.cfs_period_us"), []byte(period), 0); err != nil {
		tb.Error(err)
	}
}

// changeResult is what one change scenario gave, judged from 2 s after its last
// change to the flood's end.
type changeResult struct {
	light      float64       // light /24s' answered share
	answered   float64       // the server's answers per second, over its C after the change
	lifted     time.Duration // -1: not within the run
	overflow   uint64
	overloaded bool // the limits were in force during the flood
}

// runChange runs c with capacity auto: a /24 at 3 times the largest C of the run
// and 50 light /24s at C/200 from the start; the flood from 0.5 s until 4 s after
// the last change (2 s judged); the run ends 2.5 s after that.
func (l *capLive) runChange(tb testing.TB, C float64, c capChange) changeResult {
	defer l.setShare(tb, 1)
	child := l.start(tb, "capacity=auto")
	floodFrom, floodTo := 500*time.Millisecond, c.last+4*time.Second
	end := floodTo + 2500*time.Millisecond
	clients := l.lightClients(tb, 50, C/200, 0, end)
	w := watchRcvbuf(tb, child.cmd.Process.Pid)
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.apply(tb, l, func(d time.Duration) { time.Sleep(time.Until(start.Add(d))) })
	}()
	r := l.run(tb, end, clients, []capFlood{{rate: 3 * C * max(c.factor, 1), from: floodFrom, to: floodTo, src: oneNet24}})
	<-done
	w.stop()
	sts := child.statuses()
	child.stop()
	judged := c.last + 2*time.Second
	res := changeResult{lifted: -1}
	res.light, _ = r.share(prefixed("light"), judged, floodTo)
	res.answered = answeredRate(sts, r.start, judged, floodTo) / (C * c.factor)
	res.overflow = w.after(r.start, floodTo) - w.after(r.start, judged)
	for _, s := range sts {
		if at := time.Unix(0, s.Wall).Sub(r.start); at < floodTo && s.Capacity != nil && s.Capacity.Overloaded && s.Capacity.Level > 0 {
			res.overloaded = true
		}
		if at := time.Unix(0, s.Wall).Sub(r.start); at >= floodTo && s.Capacity != nil && !s.Capacity.Overloaded && s.Capacity.Level == 0 {
			res.lifted = at - floodTo
			break
		}
	}
	logTimeline(tb, sts, w, r.start, end)
	tb.Logf("%s: from 2 s after the last change: light /24s answered %.4f, the server %.2f of its C (%.0f), %d overflows; limits lifted %v after the flood",
		c.name, res.light, res.answered, C*c.factor, res.overflow, res.lifted)
	return res
}

// TestLiveCapacityChanges: under a flood, the capped server's speed changes (a
// burner in its cgroup for 1.5 s three times, its quota doubled, halved): the
// limits are in force during the flood and lift within 2 s of its end. What the
// light /24s and the server get from 2 s after the last change is logged here and
// reported by BenchmarkLiveCapacityChanges: on a loaded machine the capped server's
// own rate moves by a factor of 3 to 7 from one quarter second to the next, and
// the light groups' share with it (0.98-1.00 in the runs of docs/capacity.md, 0.71-0.98 with the controller before).
// The scenarios run one after another: side by side (each with a server, namespace
// and cgroup of its own) they took 14 s instead of 34 s on a quiet machine, but
// with a busy loop holding one of two cores their three floods (at 3 C, 6 C and
// 3 C, from one process) starved the servers, and the limits did not lift within
// 2 s of the flood in 8 of 9 attempts (one run, with other work on the machine).
func TestLiveCapacityChanges(t *testing.T) {
	l := newCapLive(t)
	testutil.HoldLive(t)
	C := l.sharedC(t)
	for _, c := range capChanges {
		t.Run(c.name, retryLive(func(t *testing.T, errorf func(string, ...any)) {
			res := l.runChange(t, C, c)
			if !res.overloaded {
				errorf("%s: no water level in force during the flood", c.name)
			}
			if res.lifted < 0 || res.lifted > 2*time.Second {
				errorf("%s: limits lifted %v after the flood, want within 2 s", c.name, res.lifted)
			}
		}))
	}
}

// BenchmarkLiveCapacityChanges reports, for each change, what the server answered
// from 2 s after the last change as a share of its C then (C_after), the light
// /24s' share, the receive-queue overflows then and the time the limits took to
// lift.
func BenchmarkLiveCapacityChanges(b *testing.B) {
	l := newCapLive(b)
	release, err := testutil.LockLive()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(release)
	C := l.measure(b)
	for _, c := range capChanges {
		b.Run(c.name, func(b *testing.B) {
			var sum changeResult
			n := 0
			for b.Loop() {
				r := l.runChange(b, C, c)
				sum.light += r.light
				sum.answered += r.answered
				sum.overflow += r.overflow
				sum.lifted += r.lifted
				n++
			}
			b.ReportMetric(sum.answered/float64(n), "C_after")
			b.ReportMetric(sum.light/float64(n), "light")
			b.ReportMetric(float64(sum.overflow)/float64(n), "overflows")
			b.ReportMetric((sum.lifted / time.Duration(n)).Seconds(), "s_lift")
			b.ReportMetric(C, "C")
		})
	}
}
