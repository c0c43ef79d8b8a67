package coredns

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

// Name is the plugin's name in a Corefile and in plugin.cfg.
const Name = "rrl"

var log = clog.NewWithPlugin(Name)

func init() { plugin.Register(Name, setup) }

// settings is what one rrl directive says.
type settings struct {
	zones   []string
	cfg     *rrl.Config
	kernel  bool // attach the kernel filter to the block's UDP sockets
	cookies bool // issue and verify DNS server cookies (the default; "cookies off" clears it)
	// secret is the cookies property's SECRET; nil means the process's generated
	// one (processSecret).
	secret *rrl.CookieSecret
	prev   *rrl.CookieSecret // a previous secret still accepted
	line   int               // of the directive, to name the block in errors
}

// cookieSecret returns the secret the block's cookies use; cookies must be on.
func (s *settings) cookieSecret() rrl.CookieSecret {
	if s.secret != nil {
		return *s.secret
	}
	return processSecret()
}

func setup(c *caddy.Controller) error {
	s, err := parse(c)
	if err != nil {
		return plugin.Error(Name, err)
	}
	p := newPlugin(s)
	conf := dnsserver.GetConfig(c)
	var st *loadState
	if p.groups, st, err = join(c, s, p); err != nil {
		return plugin.Error(Name, err)
	}
	if st.watch() {
		c.Set(loadKey{}, st)
		// A reload from this load that fails after the new load's OnStartup
		// leaves its Protections to close, and this load to restore.
		c.OnRestartFailed(func() error { return reloadFailed(st) })
	}
	if testHookSetup != nil {
		testHookSetup(p)
	}
	if s.kernel {
		// CoreDNS opens its UDP sockets after the OnStartup callbacks have run (on a
		// first start there is no socket yet), and calls this hook from each
		// Server's ServePacket with the socket open and before the first read: the
		// one place a plugin runs when its listener exists. On a reload the new
		// Servers reuse the old sockets, so the new Protection takes the filter over
		// in place before the old instance's OnShutdown closes its own. A Server
		// serving several blocks calls the last one's hook only, which hands the
		// sockets to all of them.
		prev := conf.UDPDecorateWriterFunc
		conf.UDPDecorateWriterFunc = func(srv *dnsserver.Server) dns.DecorateWriter {
			attachGroup(p.members(srv.Addr), srv.Addr)
			if prev != nil {
				return prev(srv)
			}
			return nil
		}
	} else {
		// Without the kernel filter the Protections still get the sockets, with
		// nothing attached to them: a reload's new Protection finds its
		// predecessor's Go limiter by them and takes it over (kernel.go).
		prev := conf.UDPDecorateWriterFunc
		conf.UDPDecorateWriterFunc = func(srv *dnsserver.Server) dns.DecorateWriter {
			attachWithoutFilter(p.members(srv.Addr), srv.Addr)
			if prev != nil {
				return prev(srv)
			}
			return nil
		}
	}
	host := ""
	if len(conf.ListenHosts) > 0 {
		host = conf.ListenHosts[0]
	}
	src, err := metricsSource(conf.Transport+"://"+joinHostPort(host, conf.Port), conf.Zone)
	if err != nil {
		return plugin.Error(Name, err)
	}
	p.src = src
	c.OnStartup(func() error {
		if err := p.start(); err != nil {
			return plugin.Error(Name, err)
		}
		src.set(p)
		return nil
	})
	c.OnShutdown(func() error {
		src.clear(p)
		return p.close()
	})
	conf.AddPlugin(func(next plugin.Handler) plugin.Handler {
		p.Next = next
		return p
	})
	return nil
}

// testHookSetup, when set by a test, is given every block's plugin as setup makes it.
var testHookSetup func(*RRL)

func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

// parse reads the rrl directive of one server block:
//
//	rrl [ZONES...] {
//	    window SECONDS
//	    ipv4-prefix-length LENGTH
//	    ipv6-prefix-length LENGTH
//	    responses-per-second ALLOWANCE
//	    nodata-per-second ALLOWANCE
//	    nxdomains-per-second ALLOWANCE
//	    referrals-per-second ALLOWANCE
//	    errors-per-second ALLOWANCE
//	    slip-ratio N
//	    requests-per-second ALLOWANCE
//	    max-table-size SIZE
//	    report-only [true|false]
//	    exempt-clients PREFIX...
//	    all-per-second ALLOWANCE
//	    qps-scale RATE
//	    ipv4-request-levels PREFIX:FACTOR...
//	    ipv6-request-levels PREFIX:FACTOR...
//	    source-port-factor FACTOR
//	    total-requests-per-second RATE
//	    reflection-ports PORT...
//	    capacity auto|RATE
//	    names on|off
//	    zones ZONE...
//	    events-per-second N
//	    kernel-filter on|off
//	    cookies [off | SECRET [PREVIOUS]]
//	    cookie-secret SECRET [PREVIOUS]
//	}
//
// The first twelve are coredns/rrl's, with its defaults (slip-ratio 0: no slips) and
// its checks; the others are this library's (see rrl.Config) and the plugin's own.
// Every keyword of rrl.ConfigKeywords is a property, its arguments joined by spaces
// being SetValue's value, so a keyword added to rrl.Config needs no change here;
// cookie-secret is the cookies property's SECRET [PREVIOUS].
func parse(c *caddy.Controller) (*settings, error) {
	s := &settings{cfg: rrl.NewConfig(), kernel: true, cookies: true}
	// coredns/rrl never slips unless asked to.
	if err := s.cfg.SetValue("slip-ratio", "0"); err != nil {
		return nil, err
	}
	seen := false
	for c.Next() {
		if seen {
			return nil, plugin.ErrOnce
		}
		seen = true
		s.line = c.Line()
		s.zones = plugin.OriginsFromArgsOrServerBlock(c.RemainingArgs(), c.ServerBlockKeys)
		for c.NextBlock() {
			if err := s.property(c); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// property reads one line of the block, the keyword under the cursor.
func (s *settings) property(c *caddy.Controller) error {
	kw := c.Val()
	args := c.RemainingArgs()
	one := func() (string, error) {
		if len(args) != 1 {
			return "", c.ArgErr()
		}
		return args[0], nil
	}
	set := func(value string) error {
		if err := s.cfg.SetValue(kw, value); err != nil {
			// The error's value, not value: it is redacted for a secret.
			return c.Errf("%s %q: %s", kw, errValue(err, value), reason(err))
		}
		return nil
	}
	switch kw {
	case "window":
		v, err := one()
		if err != nil {
			return err
		}
		// coredns/rrl takes fractional seconds; the accounts here keep whole ones,
		// so a fraction rounds up (a balance may go a little further negative).
		w, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(w) {
			return c.Errf("window %q: not a number", v)
		}
		if w <= 0 {
			return c.Errf("window %q: must be greater than zero", v)
		}
		if w > 3600 {
			return c.Errf("window %q: at most 3600 seconds", v)
		}
		return set(strconv.Itoa(int(math.Ceil(w))))
	case "max-table-size":
		v, err := one()
		if err != nil {
			return err
		}
		if n, err := strconv.Atoi(v); err == nil && n < 0 {
			return c.Errf("max-table-size %q: cannot be negative", v)
		}
		return set(v)
	case "kernel-filter":
		v, err := one()
		if err != nil {
			return err
		}
		switch v {
		case "on":
			s.kernel = true
		case "off":
			s.kernel = false
		default:
			return c.Errf("kernel-filter %q: want on or off", v)
		}
		return nil
	case "cookie-secret":
		// rrl.Config's keyword, here the cookies property's SECRET [PREVIOUS], so that
		// the blocks on one socket are checked to agree on it. The Config's error
		// never quotes the secret.
		if len(args) == 0 {
			return c.ArgErr()
		}
		if err := rrl.NewConfig().SetValue(kw, strings.Join(args, " ")); err != nil {
			return c.Errf("%s: %s (the value is not shown, as it may be a secret)", kw, reason(err))
		}
		for i, a := range args {
			args[i] = strings.TrimPrefix(strings.TrimPrefix(a, "0x"), "0X")
		}
		fallthrough
	case "cookies":
		// Never quote an argument here: it may be a secret (one typo must not leak
		// a fleet's secret into the log), so the errors say what is wrong only.
		switch {
		case len(args) == 1 && args[0] == "off":
			s.cookies, s.secret, s.prev = false, nil, nil
			return nil
		case len(args) > 2:
			return c.Err("Wrong argument count: cookies takes off, or a secret and an optional previous one")
		}
		secrets := make([]rrl.CookieSecret, len(args))
		for i, a := range args {
			b, err := hex.DecodeString(a)
			if err != nil || len(b) != len(secrets[i]) {
				which := "SECRET"
				if i == 1 {
					which = "PREVIOUS"
				}
				return c.Errf("cookies: %s is not %d hexadecimal digits (the value is not shown, as it may be a secret)", which, 2*len(secrets[i]))
			}
			copy(secrets[i][:], b)
		}
		s.cookies, s.secret, s.prev = true, nil, nil
		switch len(args) {
		case 2:
			s.prev = &secrets[1]
			fallthrough
		case 1:
			s.secret = &secrets[0]
		}
		return nil
	}
	if !slices.Contains(rrl.ConfigKeywords(), kw) {
		return c.Errf("unknown property '%s'", kw)
	}
	// Every other keyword of rrl.Config is a property of the same name whose
	// arguments, joined by spaces, are its value (a list keyword takes several).
	flag := isFlag(kw)
	switch {
	case len(args) == 0 && flag:
		return set("true")
	case len(args) == 0:
		return c.ArgErr()
	case len(args) > 1 && flag:
		return c.ArgErr()
	case len(args) > 1:
		if err := s.cfg.SetValue(kw, strings.Join(args, " ")); err != nil &&
			rrl.NewConfig().SetValue(kw, args[0]) == nil {
			return c.ArgErr() // a keyword of one value, given several
		}
	}
	return set(strings.Join(args, " "))
}

// isFlag reports whether the keyword is a boolean (report-only): true when given
// without a value, as in coredns/rrl.
func isFlag(kw string) bool {
	for _, kv := range rrl.NewConfig().Values() {
		if kv[0] == kw {
			return kv[1] == "true" || kv[1] == "false"
		}
	}
	return false
}

// errValue returns the value a Config error quotes (redacted for a secret), or v.
func errValue(err error, v string) string {
	if ce, ok := err.(*rrl.ConfigError); ok {
		return ce.Value
	}
	return v
}

// reason returns the part of a Config error that says what is wrong with the value.
func reason(err error) string {
	if ce, ok := err.(*rrl.ConfigError); ok {
		return ce.Reason
	}
	return fmt.Sprint(err)
}

// generated is the process's generated cookie secret, made on first use.
var generated = sync.OnceValue(func() rrl.CookieSecret {
	var sec rrl.CookieSecret
	rand.Read(sec[:]) // never fails: crypto/rand panics instead
	return sec
})

// processSecret returns the server cookie secret of blocks whose cookies property
// names none: random, made once per process, so that cookies stay valid across
// reloads (as BIND's generated secret does) and every such block on one address
// issues the same ones.
func processSecret() rrl.CookieSecret { return generated() }
