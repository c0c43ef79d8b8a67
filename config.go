package rrl

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config holds the settings of an RRL, a Limiter and a Filter. Create it with
// NewConfig, which sets the defaults, and change it with SetValue, which takes the
// keywords of BIND's rate-limit clause as coredns/rrl and markdingo/rrl spell them;
// a bad value gives a ConfigError and leaves the Config unchanged. A Config is not
// safe for concurrent modification; the RRL, Limiter and Filter made from it take a
// copy of what they need. docs/configuration.md explains every keyword:
//
//	window SECONDS                  how far a balance can go negative (15)
//	ipv4-prefix-length LENGTH       the IPv4 client network (24)
//	ipv6-prefix-length LENGTH       the IPv6 client network (56)
//	responses-per-second RATE       answers per (network, qtype, name); 0 (default) off
//	nodata-per-second RATE          NODATA responses (responses-per-second)
//	nxdomains-per-second RATE       NXDOMAIN responses (responses-per-second)
//	referrals-per-second RATE       referrals (responses-per-second)
//	errors-per-second RATE          other errors (responses-per-second)
//	requests-per-second RATE        queries per client network; 0 (default) off
//	slip-ratio RATIO                every RATIO-th limited response slips (2)
//	max-table-size SIZE             accounts kept (100000)
//	report-only [BOOL]              count, never withhold
//	exempt-clients LIST             addresses or prefixes never limited
//	all-per-second RATE             all responses per client network
//	qps-scale RATE                  above this query rate, allowances shrink
//	ipv4-request-levels LIST        request limit levels, "PREFIX:FACTOR ..." ("32:1 16:16")
//	ipv6-request-levels LIST        ("128:1 64:1 48:4")
//	source-port-factor FACTOR       all sources sharing one source port (1)
//	total-requests-per-second RATE  all queries together; 0 (default) off
//	reflection-ports LIST           source ports dropped unseen ("0 19 123 161 389 1900 11211")
//	capacity auto|RATE              limit requests only while the server is overloaded
//	names on|off                    under overload, limit random names by zone first (on)
//	zones NAME ...                  apexes of the served zones, never forgotten
//	events-per-second N             limiting events reported per second (10)
//	cookie-secret SECRET [ACCEPTED] the DNS server cookie secret, 32 hex digits
type Config struct {
	window           int64 // seconds
	ipv4PrefixLength int
	ipv6PrefixLength int

	responsesPerSecond float64
	nodataPerSecond    float64
	nxdomainsPerSecond float64
	referralsPerSecond float64
	errorsPerSecond    float64
	requestsPerSecond  float64
	allPerSecond       float64
	qpsScale           float64

	nodataSet, nxdomainsSet, referralsSet, errorsSet bool

	slipRatio    int
	maxTableSize int
	reportOnly   bool
	exempt       []netip.Prefix

	ipv4Levels       []requestLevel // without the client-network level unless named
	ipv6Levels       []requestLevel
	sourcePortFactor float64
	totalRequests    float64
	reflectionPorts  []uint16

	// secrets is behind a pointer so that printing a Config's fields with fmt
	// shows an address, not the secret; nil when none is configured.
	secrets *configSecrets

	// capacity is the capacity keyword: 0 off, capacityAuto, or queries per
	// second (capacity.go). capLevel is not a keyword: the water level the
	// capacity controller puts in force (0: none), see limiterParams.initCapacity.
	capacity float64
	capLevel float64

	// namesOff is the names keyword turned off (docs/names.md); zones the
	// configured apexes, lower case and fully qualified. namesLevel is not a
	// keyword: the names judge's level the controller puts in force (0: none).
	namesOff   bool
	zones      []string
	namesLevel float64

	nowFunc         func() time.Time
	eventFunc       func(LimitEvent)
	eventsPerSecond int // events-per-second
}

// requestLevel is one source prefix level of the request limiter: sources are grouped
// by their first PrefixLen bits and each group is limited to Factor times
// requests-per-second.
type requestLevel struct {
	PrefixLen int
	Factor    float64
}

// defaultReflectionPorts is the default of reflection-ports (see Config). It is an
// array, not a slice, so that no Config can change another's through it.
var defaultReflectionPorts = [...]uint16{0, 19, 123, 161, 389, 1900, 11211}

const (
	// capacityAuto is Config.capacity for "capacity auto": measured.
	capacityAuto = -1
	// maxReflectionPorts bounds the reflection-ports list, which keeps the classic
	// program small (a binary search of at most a few dozen instructions) and its
	// jumps within classic BPF's 8-bit offsets.
	maxReflectionPorts = 64
	maxRate            = 10_000_000
	defaultTable       = 100000
	maxTableSize       = 1 << 26
)

// NewConfig returns a Config with the defaults documented on Config.
func NewConfig() *Config {
	return &Config{
		window:           15,
		ipv4PrefixLength: 24,
		ipv6PrefixLength: 56,
		slipRatio:        2,
		maxTableSize:     defaultTable,
		ipv4Levels:       []requestLevel{{32, 1}, {16, 16}},
		ipv6Levels:       []requestLevel{{128, 1}, {64, 1}, {48, 4}},
		sourcePortFactor: 1,
		reflectionPorts:  slices.Clone(defaultReflectionPorts[:]),
		eventsPerSecond:  defaultEventsPerSecond,
	}
}

// ConfigKeywords lists every keyword SetValue accepts, in documentation order; a
// program can register one command-line flag per keyword from it.
func ConfigKeywords() []string {
	out := make([]string, len(keywords))
	for i, k := range keywords {
		out[i] = k.name
	}
	return out
}

// keyword is one configuration keyword: how SetValue parses it into a Config, how
// Values prints it back, which values of a Config are in range and how BIND spells
// it. Adding a keyword is adding one entry to keywords (and a line to the Config
// doc); SetValue, ConfigKeywords, Values, New's and NewRRL's range checks, the BIND
// clause parser and FormatBINDRateLimit, the CoreDNS plugin's Corefile parser and the
// example server's flags follow from it.
type keyword struct {
	name string
	// set parses the value (trimmed of spaces) into c; its error is the reason.
	set func(c *Config, v string) error
	// get prints c's value, false when it is left out (an unset allowance).
	get func(c *Config) (string, bool)
	// check reports why c's value is one set would not give (the reason), nil when
	// it is in range: a Config is a plain struct, which a zero Config literal, or
	// code of this package, fills without set. New refuses such a Config naming
	// the keyword. nil: every value is in range.
	check func(c *Config) error
	// reset replaces c's value by def's, a fresh NewConfig(): NewRRL's repair of
	// what check refuses. The value only: an allowance keeps its set flag. Every
	// keyword with a check has one.
	reset func(c, def *Config)
	// secret marks a value never printed nor quoted in an error.
	secret bool
	// bind is the spelling of BIND 9's rate-limit option of the same meaning, "" for
	// this package's extensions (accepted in a BIND clause under their own name).
	bind string
	// bindForm is how BIND writes the option's value (with bind).
	bindForm bindForm
	// example is a valid value other than the default, for tests.
	example string
}

// bindForm is the syntax of a BIND option's value.
type bindForm int

const (
	bindInteger   bindForm = iota // an unsigned integer
	bindBoolean                   // yes or no (also true, false, 1, 0)
	bindAddresses                 // an address match list: { 192.0.2.1; 2001:db8::/32; }
)

// keywords is the table of configuration keywords, in documentation order. The
// prefix lengths come before the request levels, which are checked against them:
// with the default levels (two), a prefix length can always be set, and NewRRL,
// which repairs in this order, checks the levels against a repaired prefix length.
var keywords = []keyword{
	intKeyword("window", 1, 3600, func(c *Config) *int64 { return &c.window }, "window", "5"),
	prefixKeyword("ipv4-prefix-length", 32),
	prefixKeyword("ipv6-prefix-length", 128),
	rateKeyword("responses-per-second", func(c *Config) (*float64, *bool) { return &c.responsesPerSecond, nil }, "responses-per-second"),
	rateKeyword("nodata-per-second", func(c *Config) (*float64, *bool) { return &c.nodataPerSecond, &c.nodataSet }, "nodata-per-second"),
	rateKeyword("nxdomains-per-second", func(c *Config) (*float64, *bool) { return &c.nxdomainsPerSecond, &c.nxdomainsSet }, "nxdomains-per-second"),
	rateKeyword("referrals-per-second", func(c *Config) (*float64, *bool) { return &c.referralsPerSecond, &c.referralsSet }, "referrals-per-second"),
	rateKeyword("errors-per-second", func(c *Config) (*float64, *bool) { return &c.errorsPerSecond, &c.errorsSet }, "errors-per-second"),
	rateKeyword("requests-per-second", func(c *Config) (*float64, *bool) { return &c.requestsPerSecond, nil }, ""),
	intKeyword("slip-ratio", 0, 10, func(c *Config) *int { return &c.slipRatio }, "slip", "3"),
	{name: "max-table-size", bind: "max-table-size", example: "5000",
		set: func(c *Config, v string) error {
			n, err := parseInt(v, 0, maxTableSize)
			if err != nil {
				return err
			}
			if n == 0 {
				n = defaultTable
			}
			c.maxTableSize = n
			return nil
		},
		get: func(c *Config) (string, bool) { return strconv.Itoa(c.maxTableSize), true },
		// 0, which set reads as the default, is never the table's size.
		check: func(c *Config) error { return checkInt(c.maxTableSize, 1, maxTableSize) },
		reset: resetField(func(c *Config) *int { return &c.maxTableSize })},
	{name: "report-only", bind: "log-only", bindForm: bindBoolean, example: "true",
		set: func(c *Config, v string) error {
			b := true
			if v != "" {
				var err error
				if b, err = strconv.ParseBool(v); err != nil {
					return errors.New("want true or false")
				}
			}
			c.reportOnly = b
			return nil
		},
		get: func(c *Config) (string, bool) { return strconv.FormatBool(c.reportOnly), true }},
	{name: "exempt-clients", bind: "exempt-clients", bindForm: bindAddresses, example: "192.0.2.0/24 2001:db8::1/128",
		set: func(c *Config, v string) (err error) {
			p, err := parsePrefixes(v)
			if err == nil {
				c.exempt = p
			}
			return err
		},
		get: func(c *Config) (string, bool) {
			s := make([]string, len(c.exempt))
			for i, p := range c.exempt {
				s[i] = p.String()
			}
			return strings.Join(s, " "), true
		},
		check: func(c *Config) error {
			for _, p := range c.exempt {
				if !p.IsValid() {
					return errors.New("not a valid prefix")
				}
			}
			return nil
		},
		reset: resetField(func(c *Config) *[]netip.Prefix { return &c.exempt })},
	rateKeyword("all-per-second", func(c *Config) (*float64, *bool) { return &c.allPerSecond, nil }, "all-per-second"),
	rateKeyword("qps-scale", func(c *Config) (*float64, *bool) { return &c.qpsScale, nil }, "qps-scale"),
	levelsKeyword("ipv4-request-levels", 32, "32:1 24:4"),
	levelsKeyword("ipv6-request-levels", 128, "128:1 48:2"),
	{name: "source-port-factor", example: "2",
		set: func(c *Config, v string) (err error) {
			f, err := parseFactor(v)
			if err == nil {
				c.sourcePortFactor = f
			}
			return err
		},
		get:   func(c *Config) (string, bool) { return formatNum(c.sourcePortFactor), true },
		check: func(c *Config) error { return checkFactor(c.sourcePortFactor) },
		reset: resetField(func(c *Config) *float64 { return &c.sourcePortFactor })},
	rateKeyword("total-requests-per-second", func(c *Config) (*float64, *bool) { return &c.totalRequests, nil }, ""),
	{name: "reflection-ports", example: "0 19",
		set: func(c *Config, v string) error {
			ports, err := parsePorts(v)
			if err != nil {
				return err
			}
			if err := checkPortCount(ports); err != nil {
				return err
			}
			c.reflectionPorts = ports
			return nil
		},
		get: func(c *Config) (string, bool) {
			s := make([]string, len(c.reflectionPorts))
			for i, p := range c.reflectionPorts {
				s[i] = strconv.Itoa(int(p))
			}
			return strings.Join(s, " "), true
		},
		check: func(c *Config) error { return checkPortCount(c.reflectionPorts) },
		reset: resetField(func(c *Config) *[]uint16 { return &c.reflectionPorts })},
	{name: "cookie-secret", secret: true, example: "000102030405060708090a0b0c0d0e0f",
		set: func(c *Config, v string) (err error) {
			cs, err := parseSecrets(v)
			if err == nil {
				c.secrets = cs
			}
			return err
		},
		get: func(c *Config) (string, bool) { return redacted, c.secrets != nil }},
	{name: "capacity", example: "auto",
		set: func(c *Config, v string) (err error) {
			r, err := parseCapacity(v)
			if err == nil {
				c.capacity = r
			}
			return err
		},
		get: func(c *Config) (string, bool) {
			// Off is the default, and no value says it: the keyword is left out.
			if c.capacity == capacityAuto {
				return "auto", true
			}
			return formatNum(c.capacity), c.capacity != 0
		},
		check: func(c *Config) error {
			if c.capacity == 0 || c.capacity == capacityAuto { // off, auto
				return nil
			}
			return checkCapacity(c.capacity)
		},
		reset: resetField(func(c *Config) *float64 { return &c.capacity })},
	{name: "names", example: "off",
		set: func(c *Config, v string) error {
			switch strings.ToLower(v) {
			case "on", "true", "yes":
				c.namesOff = false
			case "off", "false", "no":
				c.namesOff = true
			default:
				return errors.New("want on or off")
			}
			return nil
		},
		get: func(c *Config) (string, bool) {
			if c.namesOff {
				return "off", true
			}
			return "on", true
		}},
	{name: "zones", example: "victim.test. other.test.",
		set: func(c *Config, v string) error {
			z, err := parseZones(v)
			if err == nil {
				c.zones = z
			}
			return err
		},
		get: func(c *Config) (string, bool) { return strings.Join(c.zones, " "), len(c.zones) > 0 },
		check: func(c *Config) error {
			_, err := parseZones(strings.Join(c.zones, " "))
			return err
		},
		reset: resetField(func(c *Config) *[]string { return &c.zones })},
	intKeyword("events-per-second", 1, maxEventsPerSecond, func(c *Config) *int { return &c.eventsPerSecond }, "", "100"),
}

func formatNum(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// resetField returns a keyword's reset of the field f gives.
func resetField[T any](f func(*Config) *T) func(c, def *Config) {
	return func(c, def *Config) { *f(c) = *f(def) }
}

// intKeyword is an integer between lo and hi.
func intKeyword[T int | int64](name string, lo, hi int, field func(*Config) *T, bind, example string) keyword {
	return keyword{name: name, bind: bind, example: example,
		set: func(c *Config, v string) error {
			n, err := parseInt(v, lo, hi)
			if err == nil {
				*field(c) = T(n)
			}
			return err
		},
		get:   func(c *Config) (string, bool) { return strconv.FormatInt(int64(*field(c)), 10), true },
		check: func(c *Config) error { return checkInt(*field(c), lo, hi) },
		reset: resetField(field)}
}

// rateKeyword is a rate; when field gives a set flag, the value is left out of
// Values until set. Out of range, NewRRL resets the rate to 0 and keeps the flag.
func rateKeyword(name string, field func(*Config) (*float64, *bool), bind string) keyword {
	return keyword{name: name, bind: bind, example: "7",
		set: func(c *Config, v string) error {
			r, err := parseRate(v)
			if err != nil {
				return err
			}
			f, set := field(c)
			*f = r
			if set != nil {
				*set = true
			}
			return nil
		},
		get: func(c *Config) (string, bool) {
			f, set := field(c)
			return formatNum(*f), set == nil || *set
		},
		check: func(c *Config) error {
			f, _ := field(c)
			return checkRate(*f)
		},
		reset: func(c, def *Config) {
			f, _ := field(c)
			d, _ := field(def)
			*f = *d
		}}
}

// prefixKeyword is the client network's prefix length of the family of bitLen bits.
func prefixKeyword(name string, bitLen int) keyword {
	return keyword{name: name, bind: name, example: strconv.Itoa(bitLen / 2),
		set: func(c *Config, v string) error {
			n, err := parseInt(v, 1, bitLen)
			if err != nil {
				return err
			}
			levels, cn := c.familyLevels(bitLen)
			if err := checkLevelCount(*levels, n); err != nil {
				return err
			}
			*cn = n
			return nil
		},
		get: func(c *Config) (string, bool) {
			_, cn := c.familyLevels(bitLen)
			return strconv.Itoa(*cn), true
		},
		// The number of levels with this one is the request levels' check.
		check: func(c *Config) error {
			_, cn := c.familyLevels(bitLen)
			return checkInt(*cn, 1, bitLen)
		},
		reset: func(c, def *Config) {
			_, cn := c.familyLevels(bitLen)
			_, d := def.familyLevels(bitLen)
			*cn = *d
		}}
}

// levelsKeyword is the request levels of the family of bitLen bits.
func levelsKeyword(name string, bitLen int, example string) keyword {
	return keyword{name: name, example: example,
		set: func(c *Config, v string) error {
			parsed, err := parseLevels(v, bitLen)
			if err != nil {
				return err
			}
			levels, cn := c.familyLevels(bitLen)
			if err := checkLevelCount(parsed, *cn); err != nil {
				return err
			}
			*levels = parsed
			return nil
		},
		get: func(c *Config) (string, bool) {
			levels, _ := c.familyLevels(bitLen)
			s := make([]string, len(*levels))
			for i, l := range *levels {
				s[i] = strconv.Itoa(l.PrefixLen) + ":" + formatNum(l.Factor)
			}
			return strings.Join(s, " "), true
		},
		check: func(c *Config) error {
			levels, cn := c.familyLevels(bitLen)
			return checkLevels(*levels, bitLen, *cn)
		},
		reset: func(c, def *Config) {
			levels, _ := c.familyLevels(bitLen)
			d, _ := def.familyLevels(bitLen)
			*levels = slices.Clone(*d)
		}}
}

// familyLevels returns the request levels and client-network prefix length of the
// family of bitLen bits (32: IPv4, 128: IPv6).
func (c *Config) familyLevels(bitLen int) (*[]requestLevel, *int) {
	if bitLen == 32 {
		return &c.ipv4Levels, &c.ipv4PrefixLength
	}
	return &c.ipv6Levels, &c.ipv6PrefixLength
}

// lookupKeyword returns the table entry of name.
func lookupKeyword(name string) (keyword, bool) {
	for _, k := range keywords {
		if k.name == name {
			return k, true
		}
	}
	return keyword{}, false
}

// configSecrets are the cookie secrets of a Config: the current one and, if any,
// one more accepted.
type configSecrets struct {
	current  CookieSecret
	previous *CookieSecret
}

// redacted is shown instead of a cookie secret.
const redacted = "[redacted]"

// parseSecrets reads one or two 128-bit secrets of 32 hex digits; an empty list is
// none. Its errors never quote the value.
func parseSecrets(s string) (*configSecrets, error) {
	fields := splitList(s)
	if len(fields) == 0 {
		return nil, nil
	}
	if len(fields) > 2 {
		return nil, fmt.Errorf("%d secrets, want one, or two (the second accepted too)", len(fields))
	}
	var out [2]CookieSecret
	for i, f := range fields {
		f = strings.TrimPrefix(strings.TrimPrefix(f, "0x"), "0X")
		if len(f) != 2*len(CookieSecret{}) {
			return nil, fmt.Errorf("secret %d: want 128 bits as 32 hex digits, found %d characters", i+1, len(f))
		}
		for j := 0; j < len(f); j += 2 {
			hi, ok1 := unhex(f[j])
			lo, ok2 := unhex(f[j+1])
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("secret %d: not hexadecimal", i+1)
			}
			out[i][j/2] = hi<<4 | lo
		}
	}
	cs := &configSecrets{current: out[0]}
	if len(fields) == 2 {
		cs.previous = &out[1]
	}
	return cs, nil
}

// ConfigError is the error of a configuration: of SetValue for a bad keyword or
// value, of New (and the Update methods) for each keyword of a Config out of range
// (joined with errors.Join), and of ParseBINDRateLimit, with the line of the clause.
// No ConfigError quotes a cookie secret.
type ConfigError struct {
	// Line is the line (counted from 1) of ParseBINDRateLimit's text; 0 for an
	// error not about a clause.
	Line int
	// Keyword is the keyword (see Config) the error is about; "" for a clause's
	// syntax error or unknown option.
	Keyword string
	// Value is the value refused ([redacted] for a cookie secret), as the
	// keyword's, or as the clause writes it; "" when not one value.
	Value string
	// Reason says what is wrong. For a clause (Line > 0) it is the whole message,
	// naming the option as the clause spells it.
	Reason string
	// Err is the error behind it, if any: in a clause, SetValue's.
	Err error
}

func (e *ConfigError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("rrl: rate-limit clause, line %d: %s", e.Line, e.Reason)
	}
	return fmt.Sprintf("rrl: %s=%q: %s", e.Keyword, e.Value, e.Reason)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// SetValue sets the keyword to value. See Config for the keywords and their ranges.
func (c *Config) SetValue(keyword, value string) error {
	k, ok := lookupKeyword(keyword)
	if !ok {
		if cs, err := parseSecrets(value); err == nil && cs != nil {
			// A misspelt cookie-secret: its value is a secret all the same.
			value = redacted
		}
		return &ConfigError{Keyword: keyword, Value: value, Reason: "unknown keyword"}
	}
	// Parse into a copy so that a refused value leaves c unchanged.
	d := *c
	if err := k.set(&d, strings.TrimSpace(value)); err != nil {
		if k.secret {
			value = redacted
		}
		return &ConfigError{Keyword: keyword, Value: value, Reason: err.Error()}
	}
	*c = d
	return nil
}

// SetNowFunc replaces the clock the RRL reads (time.Now by default); for tests. On such
// a clock time passes only when Debit reads it, so limiting events come only with Debit
// calls (no timer reports them in between).
func (c *Config) SetNowFunc(now func() time.Time) { c.nowFunc = now }

// SetEventFunc has the RRL and Limiter made from c report limiting events to fn (see
// LimitEvent; SlogEvents logs them), and a Protection the kernel filter's too (see
// Filter.WatchLimited), and a capacity controller its overloads; nil, the default,
// turns events off. fn is called in the goroutine of a Debit or Allow call, of the
// timer that reports events when no traffic comes (see LimitEvent), of a Protection's
// watch of the kernel filter or of a capacity controller, holding none of the
// package's locks, so it should be quick. It may call anything on what reported the
// event (the RRL, Limiter, Filter or Protection), Close included: a Close from fn
// returns without waiting for fn's goroutine, which ends when fn returns.
func (c *Config) SetEventFunc(fn func(LimitEvent)) { c.eventFunc = fn }

// eventsPerSec is the events-per-second bound in force: the keyword's, or its
// default in a Config not made by NewConfig.
func (c *Config) eventsPerSec() int {
	if c.eventsPerSecond < 1 {
		return defaultEventsPerSecond
	}
	return c.eventsPerSecond
}

// IsActive reports whether the Config limits anything: some allowance, requests
// limit or capacity (total-requests-per-second or the capacity mode) is non-zero.
func (c *Config) IsActive() bool {
	return c.responsesPerSecond > 0 || c.nodataPerSecond > 0 || c.nxdomainsPerSecond > 0 ||
		c.referralsPerSecond > 0 || c.errorsPerSecond > 0 || c.requestsPerSecond > 0 ||
		c.allPerSecond > 0 || c.totalRequests > 0 || c.capacity != 0
}

// withoutSecrets returns c without its cookie secrets (c itself when it has none).
func (c *Config) withoutSecrets() *Config {
	if c.secrets == nil {
		return c
	}
	d := c.clone()
	d.secrets = nil
	return d
}

// clone returns a deep copy.
func (c *Config) clone() *Config {
	d := *c
	d.exempt = slices.Clone(c.exempt)
	d.ipv4Levels = slices.Clone(c.ipv4Levels)
	d.ipv6Levels = slices.Clone(c.ipv6Levels)
	d.reflectionPorts = slices.Clone(c.reflectionPorts)
	d.zones = slices.Clone(c.zones)
	if c.secrets != nil {
		cs := *c.secrets
		if cs.previous != nil {
			prev := *cs.previous
			cs.previous = &prev
		}
		d.secrets = &cs
	}
	return &d
}

// allowance returns the per-second allowance of a category, applying the rule that
// unset categories follow responses-per-second.
func (c *Config) allowance(cat AllowanceCategory) float64 {
	pick := func(v float64, set bool) float64 {
		if set {
			return v
		}
		return c.responsesPerSecond
	}
	switch cat {
	case AllowanceAnswer:
		return c.responsesPerSecond
	case AllowanceNoData:
		return pick(c.nodataPerSecond, c.nodataSet)
	case AllowanceNXDomain:
		return pick(c.nxdomainsPerSecond, c.nxdomainsSet)
	case AllowanceReferral:
		return pick(c.referralsPerSecond, c.referralsSet)
	case AllowanceError:
		return pick(c.errorsPerSecond, c.errorsSet)
	}
	return 0
}

// requestLevels returns the prefix levels of one family (IPv4 when v4), finest first,
// with the client-network level included, each with its limit in packets per second.
// Levels with a zero limit are left out, so the result is empty when
// requests-per-second is 0, unless capacity is on: then every level with a factor
// is kept, with an infinite limit when requests-per-second is 0.
func (c *Config) requestLevels(v4 bool) []levelLimit {
	levels, cn := c.ipv6Levels, c.ipv6PrefixLength
	if v4 {
		levels, cn = c.ipv4Levels, c.ipv4PrefixLength
	}
	all := slices.Clone(levels)
	if !slices.ContainsFunc(all, func(l requestLevel) bool { return l.PrefixLen == cn }) {
		all = append(all, requestLevel{cn, 1})
	}
	slices.SortFunc(all, func(a, b requestLevel) int { return b.PrefixLen - a.PrefixLen })
	var out []levelLimit
	for _, l := range all {
		r := l.Factor * c.requestsPerSecond
		if r <= 0 && c.capacity != 0 && l.Factor > 0 {
			// The capacity mode counts every level, limiting only under
			// overload: without requests-per-second a level has no limit.
			r = math.Inf(1)
		}
		if r > 0 {
			out = append(out, levelLimit{l.PrefixLen, r, l.Factor})
		}
	}
	return out
}

// levelLimit is a prefix length, its limit in packets per second and its factor.
type levelLimit struct {
	PrefixLen int
	Limit     float64
	Factor    float64
}

func parseInt(s string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("not an integer")
	}
	return n, checkInt(n, lo, hi)
}

// checkInt is the range check of an integer keyword.
func checkInt[T int | int64](n T, lo, hi int) error {
	if int64(n) < int64(lo) || int64(n) > int64(hi) {
		return fmt.Errorf("must be between %d and %d", lo, hi)
	}
	return nil
}

func parseRate(s string) (float64, error) {
	r, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("not a number")
	}
	return r, checkRate(r)
}

// checkRate is the range check of a rate.
func checkRate(r float64) error {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return fmt.Errorf("not a number")
	}
	if r < 0 || r > maxRate {
		return fmt.Errorf("must be between 0 and %d", maxRate)
	}
	return nil
}

// parseCapacity reads the capacity keyword's value: auto, or a rate above 0.
func parseCapacity(s string) (float64, error) {
	if strings.EqualFold(s, "auto") {
		return capacityAuto, nil
	}
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(r) || math.IsInf(r, 0) {
		return 0, fmt.Errorf("want auto or a number of queries per second")
	}
	return r, checkCapacity(r)
}

// checkCapacity is the range check of the capacity keyword's rate.
func checkCapacity(r float64) error {
	if !(r > 0 && r <= maxRate) { // NaN too
		return fmt.Errorf("must be auto or above 0 and at most %d", maxRate)
	}
	return nil
}

func parseFactor(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("not a number")
	}
	return f, checkFactor(f)
}

// checkFactor is the range check of a request level's or the source port's factor.
func checkFactor(f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("not a number")
	}
	if f < 0 || f > 1_000_000 {
		return fmt.Errorf("factor must be between 0 and 1000000")
	}
	return nil
}

func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
}

func parsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range splitList(s) {
		var p netip.Prefix
		if strings.Contains(f, "/") {
			var err error
			if p, err = netip.ParsePrefix(f); err != nil {
				return nil, fmt.Errorf("%q is not an address or prefix", f)
			}
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
		} else {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("%q is not an address or prefix", f)
			}
			if a.Zone() != "" {
				return nil, fmt.Errorf("%q: zones are not allowed", f)
			}
			a = a.Unmap()
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func parseLevels(s string, bitLen int) ([]requestLevel, error) {
	var out []requestLevel
	for _, f := range splitList(s) {
		p, fac, ok := strings.Cut(f, ":")
		if !ok {
			return nil, fmt.Errorf("%q: want PREFIX:FACTOR", f)
		}
		n, err := parseInt(p, 1, bitLen)
		if err != nil {
			return nil, fmt.Errorf("prefix %q: %v", p, err)
		}
		x, err := parseFactor(fac)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", f, err)
		}
		if slices.ContainsFunc(out, func(l requestLevel) bool { return l.PrefixLen == n }) {
			return nil, fmt.Errorf("prefix /%d given twice", n)
		}
		out = append(out, requestLevel{n, x})
	}
	slices.SortFunc(out, func(a, b requestLevel) int { return b.PrefixLen - a.PrefixLen })
	return out, nil
}

// checkLevels is the check of the request levels of the family of bitLen bits,
// with the client-network prefix length cn: what parseLevels and checkLevelCount
// refuse.
func checkLevels(levels []requestLevel, bitLen, cn int) error {
	for i, l := range levels {
		if err := checkInt(l.PrefixLen, 1, bitLen); err != nil {
			return fmt.Errorf("prefix /%d: %v", l.PrefixLen, err)
		}
		if err := checkFactor(l.Factor); err != nil {
			return fmt.Errorf("/%d: %v", l.PrefixLen, err)
		}
		if slices.ContainsFunc(levels[:i], func(o requestLevel) bool { return o.PrefixLen == l.PrefixLen }) {
			return fmt.Errorf("prefix /%d given twice", l.PrefixLen)
		}
	}
	return checkLevelCount(levels, cn)
}

// checkPortCount bounds the reflection ports: the classic prefilter compares the
// source port with each of them.
func checkPortCount(ports []uint16) error {
	if len(ports) > maxReflectionPorts {
		return fmt.Errorf("%d ports, at most %d", len(ports), maxReflectionPorts)
	}
	return nil
}

// checkLevelCount verifies that levels plus the client-network level cn stay within
// the maximum number of levels the filter has sketches for.
func checkLevelCount(levels []requestLevel, cn int) error {
	n := len(levels)
	if !slices.ContainsFunc(levels, func(l requestLevel) bool { return l.PrefixLen == cn }) {
		n++
	}
	if n > maxRequestLevel {
		return fmt.Errorf("at most %d request levels per family, including the client network /%d", maxRequestLevel, cn)
	}
	return nil
}

func parsePorts(s string) ([]uint16, error) {
	var out []uint16
	for _, f := range splitList(s) {
		n, err := parseInt(f, 0, 65535)
		if err != nil {
			return nil, fmt.Errorf("port %q: %v", f, err)
		}
		if !slices.Contains(out, uint16(n)) {
			out = append(out, uint16(n))
		}
	}
	slices.Sort(out)
	return out, nil
}

// Values returns c as keyword and value pairs: SetValue applied to NewConfig() with
// them, in order, gives a Config equal to c, but for its cookie secret, which is
// shown as cookie-secret [redacted] when configured. Tools print it.
func (c *Config) Values() [][2]string { return c.pairs(true) }

// String returns the configuration as keyword=value pairs, the form SetValue takes.
func (c *Config) String() string {
	var b strings.Builder
	for i, kv := range c.Values() {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%q", kv[0], kv[1])
	}
	return b.String()
}

// configPairs returns keyword, value pairs that, applied with SetValue to NewConfig()
// in order, give a Config equal to c (but for its clock and its cookie secret, which
// is left out: the pinned filter stores these pairs as text).
func configPairs(c *Config) [][2]string { return c.pairs(false) }

// pairs returns c's keyword, value pairs in table order; secrets, shown redacted,
// only when withSecrets.
func (c *Config) pairs(withSecrets bool) [][2]string {
	var out [][2]string
	for _, k := range keywords {
		if k.secret && !withSecrets {
			continue
		}
		if v, ok := k.get(c); ok {
			out = append(out, [2]string{k.name, v})
		}
	}
	return out
}

// unhex is the value of the hexadecimal digit c.
func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// maxZones bounds the zones keyword: the learner's apex table holds 1,024 zones, and
// configured ones are never evicted.
const maxZones = 256

// parseZones reads the zones keyword: domain names, space or comma separated, each
// made lower case and fully qualified; the root, a name with a control character,
// space or non-ASCII byte, a name that does not pack and a name of more than 63 labels
// are refused.
func parseZones(v string) ([]string, error) {
	fields := splitList(v)
	if len(fields) > maxZones {
		return nil, fmt.Errorf("%d zones, at most %d", len(fields), maxZones)
	}
	out := make([]string, 0, len(fields))
	var q qname
	for _, f := range fields {
		z := strings.ToLower(f)
		if !strings.HasSuffix(z, ".") {
			z += "."
		}
		if z == "." || strings.ContainsFunc(z, func(r rune) bool { return r <= ' ' || r >= 0x7f }) || !qnameOf(z, 0, &q) || q.labels > apexDepthMask {
			return nil, fmt.Errorf("%q is not a zone's name", f)
		}
		if !slices.Contains(out, z) {
			out = append(out, z)
		}
	}
	return out, nil
}
