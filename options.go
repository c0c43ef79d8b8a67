package rrl

import (
	"time"
)

// Option configures Protect, NewProtection and NewHandler. NewHandler heeds only
// WithCookies and WithFilter.
type Option func(*options)

type options struct {
	cookies    *Cookies
	noCookies  bool
	pinDir     string
	noFilter   bool
	tcpPerConn int
	filter     *Filter          // the filter a Handler of NewHandler teaches
	now        func() time.Time // cookie clock, for tests (time.Now by default)
	limiter    *Limiter         // a Handler's own Go request limits, for tests
}

// WithCookies makes the server verify and issue DNS server cookies with c: queries
// over UDP with a valid server cookie are not rate limited, responses to queries
// with a client cookie carry a server cookie, slips become BADCOOKIE for them, and
// malformed COOKIE options are answered with FORMERR. A Protection has cookies by
// default, with the Config's cookie-secret or a random secret; WithCookies shares
// one secret between servers, and a cookie-secret in the Config (at the start or in
// Update) is applied to c. Either way the secret counts as the site's: a pinned
// filter gets it (see Protect).
func WithCookies(c *Cookies) Option { return func(o *options) { o.cookies = c } }

// WithoutCookies turns a Protection's DNS server cookies off.
func WithoutCookies() Option { return func(o *options) { o.noCookies = true } }

// WithPinned makes a Protection attach the filter a privileged step pinned in dir
// (LoadPinned, or rrlctl load) instead of loading one, which needs no privilege
// (Linux 5.19 and later); when that fails the Protection falls back as Attach does,
// and Status says why.
func WithPinned(dir string) Option { return func(o *options) { o.pinDir = dir } }

// WithoutFilter makes a Protection attach no kernel filter: the request limits apply
// in Go. For a server whose sockets get a filter from outside (rrlctl attach), which
// should then leave requests-per-second at 0 in cfg so as not to limit twice.
func WithoutFilter() Option { return func(o *options) { o.noFilter = true } }

// WithFilter makes a Handler of NewHandler teach f what exists from every response
// its inner handler computes, as a Protection's Handler teaches its own filter: the
// kernel's names judge (docs/names.md) knows only the names the server answered as
// existing, so a server that attaches a Filter itself (Attach, AttachPinned) and
// serves with NewHandler gives it the Filter this way. Protect and NewProtection
// ignore it: a Protection teaches the filter it attaches.
func WithFilter(f *Filter) Option { return func(o *options) { o.filter = f } }

// WithTCPConnsPerClient sets the concurrent TCP connections each client may hold on
// a Protection's TCP servers (tcplimit.DefaultConnsPerClient by default).
func WithTCPConnsPerClient(n int) Option { return func(o *options) { o.tcpPerConn = n } }

// withClock sets the clock server cookies are made and verified with (time.Now by
// default), for tests. The RRL has its own (Config.SetNowFunc).
func withClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// withLimiter makes a Handler hold UDP queries to l's request limits before the
// inner handler sees them, as a Protection's Handler does where the eBPF filter is
// not in force; for tests of the Handler alone.
func withLimiter(l *Limiter) Option { return func(o *options) { o.limiter = l } }
