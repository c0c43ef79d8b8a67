package rrl

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCapacityKeyword(t *testing.T) {
	good := []struct {
		value string
		want  float64
		text  string // its value in Values
	}{
		{"auto", capacityAuto, "auto"},
		{"AUTO", capacityAuto, "auto"},
		{" auto ", capacityAuto, "auto"},
		{"4500", 4500, "4500"},
		{"0.5", 0.5, "0.5"},
		{"1e4", 10000, "10000"},
		{"10000000", 10000000, "1e+07"},
	}
	for _, c := range good {
		cfg := NewConfig()
		if err := cfg.SetValue("capacity", c.value); err != nil {
			t.Errorf("capacity %q: %v", c.value, err)
			continue
		}
		if cfg.capacity != c.want {
			t.Errorf("capacity %q: %v, want %v", c.value, cfg.capacity, c.want)
		}
		var text string
		for _, kv := range cfg.Values() {
			if kv[0] == "capacity" {
				text = kv[1]
			}
		}
		if text != c.text {
			t.Errorf("capacity %q: Values gives %q, want %q", c.value, text, c.text)
		}
		back, err := parseConfigText(configText(cfg))
		if err != nil || back.capacity != c.want {
			t.Errorf("capacity %q: through the config text: %v, %v", c.value, back, err)
		}
		if !cfg.IsActive() || validate(cfg) != nil {
			t.Errorf("capacity %q: IsActive %v, validate %v", c.value, cfg.IsActive(), validate(cfg))
		}
	}
	for _, v := range []string{"0", "-1", "-4500", "off", "", "x", "NaN", "Inf", "+Inf", "1e8", "auto auto", "0x10"} {
		cfg := NewConfig()
		cfg.SetValue("capacity", "300")
		err := cfg.SetValue("capacity", v)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Keyword != "capacity" || ce.Value != v {
			t.Errorf("capacity %q: %v, want a ConfigError naming the keyword and the value", v, err)
			continue
		}
		if !strings.Contains(err.Error(), "capacity") || !strings.Contains(err.Error(), `"`+v+`"`) {
			t.Errorf("capacity %q: message %q does not name the keyword and the value", v, err)
		}
		if cfg.capacity != 300 {
			t.Errorf("capacity %q refused, but the Config changed to %v", v, cfg.capacity)
		}
	}
	// Off is the default and is not listed.
	for _, kv := range NewConfig().Values() {
		if kv[0] == "capacity" {
			t.Errorf("capacity listed by Values when off: %q", kv[1])
		}
	}
}

func TestCapacityBINDClause(t *testing.T) {
	cfg, err := ParseBINDRateLimit("rate-limit {\n\tresponses-per-second 5;\n\tcapacity auto;\n};", nil)
	if err != nil || cfg.capacity != capacityAuto || cfg.responsesPerSecond != 5 {
		t.Fatalf("capacity auto: %v, %v", cfg, err)
	}
	if cfg, err := ParseBINDRateLimit("capacity 2500;", nil); err != nil || cfg.capacity != 2500 {
		t.Fatalf("capacity 2500: %v, %v", cfg, err)
	}
	base := NewConfig()
	for _, text := range []string{
		"rate-limit {\n\tresponses-per-second 5;\n\tcapacity 0;\n};",
		"rate-limit {\n\tresponses-per-second 5;\n\tcapacity -3;\n};",
		"rate-limit {\n\tresponses-per-second 5;\n\tcapacity sometimes;\n};",
	} {
		got, err := ParseBINDRateLimit(text, base)
		var be *ConfigError
		if got != nil || !errors.As(err, &be) || be.Line != 3 || !strings.Contains(err.Error(), "capacity") {
			t.Errorf("%q: %v, %v; want an error on line 3 naming capacity", text, got, err)
		}
	}
	if base.capacity != 0 || base.responsesPerSecond != 0 {
		t.Errorf("a refused clause changed its base: %v", base)
	}
}

// fakeCapacitySource is a capacitySource whose samples and failures a test sets.
type fakeCapacitySource struct {
	in      capacityInput
	err     error
	applied []float64
}

func (s *fakeCapacitySource) sample(now int64) (capacityInput, error) {
	in := s.in
	in.Now = now
	return in, s.err
}
func (s *fakeCapacitySource) nodes(now int64) []capacityNode { return nil }
func (s *fakeCapacitySource) apply(level float64) error {
	s.applied = append(s.applied, level)
	return nil
}

// TestCapacityUnmeasurable: a controller whose counters cannot be read, or that has
// no receive queue to watch (capacity auto), says so in its status and lifts any
// water level, so that the static limits stay in force; a configured capacity needs
// no socket.
func TestCapacityUnmeasurable(t *testing.T) {
	for _, c := range []struct {
		name       string
		configured float64
		sockets    int
		err        error
		problem    string
	}{
		{"no socket", capacityAuto, 0, nil, "no socket"},
		{"counters unreadable", capacityAuto, 1, errors.New("rrl: capacity: read the filter's counters: boom"), "boom"},
		{"configured without a socket", 3000, 0, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := NewConfig()
			cfg.capacity = c.configured
			r := &capacityRun{cfg: cfg}
			src := &fakeCapacitySource{in: capacityInput{Sockets: c.sockets}, err: c.err}
			ctrl := newCapacityController(max(c.configured, 0))
			// An overload in force: a level was set.
			ctrl.overloaded, ctrl.level, ctrl.written = true, 10, 10
			r.step(ctrl, src, 1e9, cfg)
			r.step(ctrl, src, 2e9, cfg)
			st := r.stats()
			if c.problem == "" {
				if st.Problem != "" {
					t.Errorf("problem %q, want none", st.Problem)
				}
				return
			}
			if !strings.Contains(st.Problem, c.problem) || !strings.Contains(st.Problem, "capacity") {
				t.Errorf("problem %q, want it to say %q", st.Problem, c.problem)
			}
			if len(src.applied) != 1 || src.applied[0] != 0 {
				t.Errorf("levels applied %v, want the level lifted once", src.applied)
			}
			if st.Overloaded || st.Level != 0 {
				t.Errorf("status %+v: want no overload, no level", st)
			}
		})
	}
}

// TestCapacityEvents: an overload's start and stop are LimitEvents of AccountCapacity
// with the capacity and the arrivals, the stop with the overload's length; at most
// events-per-second of them in a second, the others counted as suppressed, and an
// overload whose start was suppressed reports no stop.
func TestCapacityEvents(t *testing.T) {
	var events []LimitEvent
	cfg := NewConfig()
	cfg.capacity = 1000
	cfg.SetEventFunc(func(e LimitEvent) { events = append(events, e) })
	mustSet(t, cfg, "events-per-second", strconv.Itoa(2))
	r := &capacityRun{cfg: cfg}
	r.events.perSec = cfg.eventsPerSec()
	src := &fakeCapacitySource{}
	ctrl := newCapacityController(1000)
	now := int64(0)
	// run sends rate queries per second for d, in 25 ms samples.
	run := func(rate float64, d time.Duration) {
		for end := now + int64(d); now < end; {
			now += int64(capacitySampleEvery)
			n := uint64(rate * capacitySampleEvery.Seconds())
			src.in.Demand += n
			src.in.Admitted += n
			src.in.Served += n
			r.step(ctrl, src, now, cfg)
		}
	}
	run(100, time.Second)
	run(5000, time.Second)
	run(100, 2*time.Second)
	if len(events) != 2 {
		t.Fatalf("events %v, want a start and a stop", events)
	}
	start, stop := events[0], events[1]
	if start.Stop || start.Account != AccountCapacity || start.Limit != 1000 || start.Rate < 1000 {
		t.Errorf("start %+v: want AccountCapacity, limit 1000, the arrivals over it", start)
	}
	if !stop.Stop || stop.Account != AccountCapacity || stop.Rate > 800 || stop.Duration < 900*time.Millisecond || stop.Duration > 2*time.Second {
		t.Errorf("stop %+v: want the arrivals under 80%%, about 1.5 s of overload", stop)
	}
	if s := start.String(); !strings.Contains(s, "capacity") || !strings.Contains(s, "limit 1000/s") {
		t.Errorf("start reads %q", s)
	}
	// Flapping: overloads starting and stopping within one second of the clock.
	var got []LimitEvent
	sec := (now/1e9 + 1) * 1e9
	st := capacityStatus{capacity: 1000, demand: 2000}
	for i := range 8 {
		dec := capacityDecision{Start: i%2 == 0, Stop: i%2 == 1}
		if ev, ok := r.event(dec, st, sec+int64(i)*int64(time.Millisecond), cfg); ok {
			got = append(got, ev)
		}
	}
	if len(got) != 2 || got[0].Stop || !got[1].Stop {
		t.Fatalf("events in one second %v, want the bound of 2: a start and its stop", got)
	}
	// The next second: a start, counting the three starts suppressed (whose stops
	// were not reported).
	ev, ok := r.event(capacityDecision{Start: true}, st, sec+int64(time.Second), cfg)
	if !ok || ev.Stop || ev.Suppressed != 3 {
		t.Errorf("next start %+v (%v): want reported with 3 suppressed", ev, ok)
	}
}
