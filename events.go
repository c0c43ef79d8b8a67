package rrl

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"time"
)

// Limiting events tell an operator who is being limited: an RRL reports when it starts
// limiting an account and when the account has recovered, and a Limiter does the same
// for its source groups. They go to the function set with Config.SetEventFunc
// (SlogEvents writes them to a log/slog Logger).
//
// A spoofed flood can make every packet come from a new network, so events are
// bounded: at most events-per-second of them in each second of the clock (see
// the keyword events-per-second), the rest counted and the count reported in the next
// event's Suppressed. An account or group whose start was suppressed reports no stop.
// Only a bounded number of episodes are followed at once (maxTracked for an RRL,
// maxGroups for a Limiter); starts beyond that are suppressed too.
//
// Events are driven by time as well as by traffic: while an episode is open, a timer
// reports what falls due when no query comes to do it, so a burst followed by silence
// still has its start and its stop reported (rrl_events.go, limiter_events.go). Without
// an event function there is no timer and Debit and Allow pay nothing for events.

// LimitEvent reports that limiting of one account of an RRL, or of one source group of
// a Limiter, started or stopped.
type LimitEvent struct {
	// Stop is false when limiting started and true when it stopped.
	Stop bool
	// Time is when the RRL or Limiter found the change, on its clock.
	Time time.Time
	// Account is what is limited: a response account, the requests-per-second or
	// all-per-second account of a client network, or a request limiter group.
	Account AccountKind
	// Network is the client network (RRL) or the group's source prefix (Limiter).
	// It is the zero Prefix for the Limiter's port and total groups.
	Network netip.Prefix
	// Category, Name and Type identify a response account: its category, its
	// salient name (answers, referrals, NODATA and NXDOMAIN) and its query type
	// (answers and referrals). Name is "" and Type 0 where the category has none.
	Category AllowanceCategory
	Name     string
	Type     uint16
	// Node is the Limiter node of the group (NodeNone for RRL accounts) and Port its
	// source port (NodePort groups only).
	Node LimiterNode
	Port uint16
	// Limit is the account's or group's limit per second.
	Limit float64
	// Rate is the rate seen per second. RRL: debits of the account since limiting
	// started, divided by the time since (a start is reported once it has gone on
	// for a second, or when it ends sooner); on Stop the average over the episode.
	// Limiter: the group's estimated rate when the change was found.
	Rate float64
	// Count is the number of debits of the account since limiting started (RRL; 0
	// for Limiter groups).
	Count uint64
	// Names and Networks are, for AccountNames, the distinct random names of the
	// zone and the distinct client networks (ipv4-prefix-length,
	// ipv6-prefix-length) they came from since limiting started: estimates with a
	// standard error of 3.3% (docs/names.md). They are 0 where not known: when the
	// kernel filter judges names (its program does not count them), or more zones
	// are limited at once than are counted.
	Names, Networks int
	// Duration is how long limiting lasted (Stop only).
	Duration time.Duration
	// Evicted reports, on Stop, that the account left the table (evicted, or the
	// table was replaced by Update) before it was seen to recover.
	Evicted bool
	// ReportOnly reports that the limiter is in report-only mode: it would have
	// limited, but sent everything.
	ReportOnly bool
	// Suppressed is the number of events not reported since the previous reported
	// one, because of the events-per-second bound or because too many accounts were
	// being followed at once.
	Suppressed uint64
}

// AccountKind tells what a LimitEvent is about.
type AccountKind uint8

const (
	// AccountResponses is a response account: client network and response tuple.
	AccountResponses AccountKind = iota
	// AccountRequests is a client network's requests-per-second account.
	AccountRequests
	// AccountAll is a client network's all-per-second account.
	AccountAll
	// AccountGroup is a source group of the request Limiter.
	AccountGroup
	// AccountCapacity is the server as a whole in the capacity mode (Config keyword
	// capacity): an overload started (the request limits went down to the water
	// level) or ended (they lifted). Limit is the capacity, Rate the queries
	// arriving per second.
	AccountCapacity
	// AccountNames is the queries for names the server has not answered as
	// existing (random names) in one zone, Name, in the capacity mode's names
	// judge (Config keyword names): limited by zone during an overload. Limit is
	// the zone's limit per second, Rate its random names' arrival rate; Node is
	// NodeNames.
	AccountNames
)

func (k AccountKind) String() string {
	switch k {
	case AccountResponses:
		return "responses"
	case AccountRequests:
		return "requests"
	case AccountAll:
		return "all-responses"
	case AccountGroup:
		return "requests-group"
	case AccountCapacity:
		return "capacity"
	case AccountNames:
		return "names"
	}
	return fmt.Sprintf("AccountKind(%d)", uint8(k))
}

// String describes e in the manner of BIND's rate-limit log lines, e.g. "limit
// responses to 192.0.2.0/24 for www.example. A (rate 40/s, limit 5/s)".
func (e LimitEvent) String() string {
	var b strings.Builder
	switch {
	case e.Stop && e.ReportOnly:
		b.WriteString("would stop limiting ")
	case e.Stop:
		b.WriteString("stop limiting ")
	case e.ReportOnly:
		b.WriteString("would limit ")
	default:
		b.WriteString("limit ")
	}
	b.WriteString(e.what())
	fmt.Fprintf(&b, " (rate %.4g/s, limit %.4g/s", e.Rate, e.Limit)
	if e.Stop {
		fmt.Fprintf(&b, ", for %v", e.Duration.Round(time.Millisecond))
		if e.Evicted {
			b.WriteString(", account evicted")
		}
	}
	b.WriteString(")")
	if e.Suppressed > 0 {
		fmt.Fprintf(&b, "; %d events suppressed", e.Suppressed)
	}
	return b.String()
}

// what names the account or group.
func (e LimitEvent) what() string {
	switch e.Account {
	case AccountGroup:
		switch e.Node {
		case NodePort:
			return fmt.Sprintf("requests from source port %d", e.Port)
		case NodeTotal:
			return "all requests"
		}
		return fmt.Sprintf("requests from %v (%v)", e.Network, e.Node)
	case AccountRequests:
		return fmt.Sprintf("requests from %v", e.Network)
	case AccountCapacity:
		return "requests to the server's capacity"
	case AccountNames:
		if e.Names == 0 {
			return fmt.Sprintf("random-subdomain queries under %s (names and networks not counted), names known to exist served", e.Name)
		}
		return fmt.Sprintf("random-subdomain queries under %s (about %d names from about %d networks), names known to exist served", e.Name, e.Names, e.Networks)
	case AccountAll:
		return fmt.Sprintf("all responses to %v", e.Network)
	}
	s := fmt.Sprintf("%s to %v", categoryWords(e.Category), e.Network)
	if e.Name != "" {
		s += " for " + e.Name
		if e.Type != 0 {
			s += " " + typeName(e.Type)
		}
	}
	return s
}

// categoryWords names the responses of a category as BIND's log lines do.
func categoryWords(c AllowanceCategory) string {
	switch c {
	case AllowanceAnswer:
		return "responses"
	case AllowanceReferral:
		return "referral responses"
	case AllowanceNoData:
		return "NODATA responses"
	case AllowanceNXDomain:
		return "NXDOMAIN responses"
	}
	return "error responses"
}

// typeName is the mnemonic of the common query types, else TYPEnnn (RFC 3597).
func typeName(t uint16) string {
	switch t {
	case 1:
		return "A"
	case 2:
		return "NS"
	case 5:
		return "CNAME"
	case 6:
		return "SOA"
	case 12:
		return "PTR"
	case 15:
		return "MX"
	case 16:
		return "TXT"
	case 28:
		return "AAAA"
	case 33:
		return "SRV"
	case 43:
		return "DS"
	case 48:
		return "DNSKEY"
	case 255:
		return "ANY"
	}
	return fmt.Sprintf("TYPE%d", t)
}

// SlogEvents returns an event function (for Config.SetEventFunc) that logs every
// event to logger at level Info (Warn for starts in enforcing mode), with the message
// LimitEvent.String and the fields as attributes.
func SlogEvents(logger *slog.Logger) func(LimitEvent) {
	return func(e LimitEvent) {
		level := slog.LevelInfo
		if !e.Stop && !e.ReportOnly {
			level = slog.LevelWarn
		}
		attrs := []slog.Attr{
			slog.String("event", map[bool]string{false: "start", true: "stop"}[e.Stop]),
			slog.String("account", e.Account.String()),
		}
		if e.Network.IsValid() {
			attrs = append(attrs, slog.String("network", e.Network.String()))
		}
		if e.Account == AccountResponses {
			attrs = append(attrs, slog.String("category", e.Category.String()))
			if e.Name != "" {
				attrs = append(attrs, slog.String("name", e.Name))
			}
			if e.Type != 0 {
				attrs = append(attrs, slog.String("type", typeName(e.Type)))
			}
		}
		if e.Account == AccountNames {
			attrs = append(attrs, slog.String("zone", e.Name))
			if e.Names > 0 {
				attrs = append(attrs, slog.Int("names", e.Names), slog.Int("networks", e.Networks))
			}
		}
		if e.Account == AccountGroup {
			attrs = append(attrs, slog.String("node", e.Node.String()))
			if e.Node == NodePort {
				attrs = append(attrs, slog.Int("port", int(e.Port)))
			}
		}
		attrs = append(attrs, slog.Float64("rate", e.Rate), slog.Float64("limit", e.Limit))
		if e.Stop {
			attrs = append(attrs, slog.Duration("duration", e.Duration))
			if e.Evicted {
				attrs = append(attrs, slog.Bool("evicted", true))
			}
		}
		if e.ReportOnly {
			attrs = append(attrs, slog.Bool("report_only", true))
		}
		if e.Suppressed > 0 {
			attrs = append(attrs, slog.Uint64("suppressed", e.Suppressed))
		}
		logger.LogAttrs(context.Background(), level, e.String(), attrs...)
	}
}

// defaultEventsPerSecond bounds the events an RRL or Limiter reports per second
// unless the keyword events-per-second says otherwise.
const defaultEventsPerSecond = 10

// maxEventsPerSecond is the largest events-per-second.
const maxEventsPerSecond = 1_000_000

// eventTicks is the timer of an RRL's or Limiter's events, which reports what is due
// when no traffic comes to do it. Its user serialises calls with its own mutex.
type eventTicks struct {
	after func(time.Duration, func()) eventTimer // afterFunc, or nil for no timer; tests replace it
	timer eventTimer
	armed bool // a tick is pending or running
	off   bool // events were turned off: no more ticks
}

// eventTimer is a pending tick (a *time.Timer).
type eventTimer interface{ Stop() bool }

func afterFunc(d time.Duration, f func()) eventTimer { return time.AfterFunc(d, f) }

// Ticks come at least minEventTick and at most maxEventTick apart.
const (
	minEventTick = 10 * time.Millisecond
	maxEventTick = time.Second
)

// arm has f called after d, within [minEventTick, maxEventTick].
func (t *eventTicks) arm(d time.Duration, f func()) {
	t.armed = true
	t.timer = t.after(min(max(d, minEventTick), maxEventTick), f)
}

// stop turns the ticks off and stops a pending one.
func (t *eventTicks) stop() {
	t.off = true
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
	t.armed = false
}

// eventBudget allows at most perSec events in each whole second of a clock in
// nanoseconds and counts the others. Its user serialises calls.
type eventBudget struct {
	perSec     int
	sec        int64 // the second being counted
	used       int
	suppressed uint64
}

// take reports whether an event may be reported at now (ns); if not, it counts it.
func (b *eventBudget) take(now int64) bool {
	if sec := now / int64(time.Second); sec != b.sec {
		b.sec, b.used = sec, 0
	}
	if b.used >= b.perSec {
		b.suppressed++
		return false
	}
	b.used++
	return true
}

// stamp gives e the suppressed count and resets it: e is about to be reported.
func (b *eventBudget) stamp(e *LimitEvent) {
	e.Suppressed = b.suppressed
	b.suppressed = 0
}
