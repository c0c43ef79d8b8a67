package loadgen

import (
	"math"
	"sync"
	"time"
)

// SendLog records when each flow's packets were sent, and can be read while a Pace
// run is still sending into it.
type SendLog struct {
	mu    sync.Mutex
	start time.Time
	times [][]time.Duration
}

// NewSendLog returns an empty log of flows flows for a run that began at start.
func NewSendLog(start time.Time, flows int) *SendLog {
	return &SendLog{start: start, times: make([][]time.Duration, flows)}
}

// Add notes that flow fi sent a packet now.
func (l *SendLog) Add(fi int) {
	l.mu.Lock()
	l.times[fi] = append(l.times[fi], time.Since(l.start))
	l.mu.Unlock()
}

// Since returns how long ago the run began.
func (l *SendLog) Since() time.Duration { return time.Since(l.start) }

// DecayedRate is what an exponentially decaying rate estimator with time constant
// tau reads at time at (since the start) for flow fi: the sum of exp(-(at-t)/tau)/tau
// over the packets sent at t <= at. It is the rate "what was sent" has for a filter
// estimating that way.
func (l *SendLog) DecayedRate(fi int, at, tau time.Duration) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	sum := 0.0
	for _, t := range l.times[fi] {
		if t <= at {
			sum += math.Exp(-(at - t).Seconds() / tau.Seconds())
		}
	}
	return sum / tau.Seconds()
}
