// Command authserver is a small authoritative DNS server protected by rrl: the
// kernel filter on its UDP socket (or, without CAP_BPF, the classic prefilter and
// the Go request limiter), response rate limiting with slip and DNS cookies in
// front of its handler, and a per-client limit on TCP connections.
//
// Usage:
//
//	authserver [-listen 127.0.0.1:5353] [-zone FILE [-origin NAME]]... [-metrics ADDR]
//	           [-bind-rate-limit FILE] [-KEYWORD VALUE ...]
//	authserver -demo [-demo-duration 10s] [-demo-flood-rate 10000]
//
// It serves the embedded zone example.test. (see example.test.zone), or the zones in
// the FILEs, over UDP and TCP: -zone may be repeated, each -origin belongs to the
// -zone next to it (see zones.go), and a query goes to the zone with the longest
// origin that holds its name. Every rrl configuration keyword is a flag of its own name
// (-responses-per-second 5, -slip-ratio 2, -report-only, ...); only the flags given
// are applied, except -zones, which defaults to the served origins (the zones the
// capacity mode's names judge knows from the start). -bind-rate-limit FILE applies a BIND rate-limit clause on top of them,
// re-read on SIGHUP (see reload.go). DNS server cookies are on (-cookies=false turns
// them off): a resolver that echoes its server cookie is judged at its own address
// by the request limits, wherever they run, and its answers are not rate limited;
// -cookie-secret (or cookie-secret in the clause file) sets the site's secret.
// -metrics serves Prometheus metrics at
// http://ADDR/metrics (the server's own, the Go runtime's and the process's). SIGINT or
// SIGTERM shuts the server down gracefully.
//
// With -demo it serves on a loopback port of its own and, for ten seconds, sends
// itself the traffic of legitimate resolvers together with a spoofed amplification
// flood (raw sockets when run as root, else ordinary sockets), shows the progress
// and prints what reached whom. Exit status: 0 success, 1 failure, 2 bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/dnsrake/rrl/tcplimit"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/rrlprom"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the parsed command line.
type options struct {
	listen      string
	listenSet   bool
	zones       []zoneArg // the -zone flags with their -origin, in order
	metrics     string
	bindFile    string
	tcpConns    int
	settings    [][2]string // keyword, value: the rrl flags given, in order
	secretErr   error       // a refused -cookie-secret, reported after parsing
	noFilter    bool
	noCookies   bool
	demo        bool
	demoDur     time.Duration
	demoRate    float64
	demoClients int
}

// parseFlags parses args; the error is a usage error.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("authserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:5353", "`address` to serve on, UDP and TCP")
	zf := zoneFlags{o: o}
	fs.Func("zone", "zone `file` to serve instead of the embedded example.test. (repeat for several zones)", zf.zone)
	fs.Func("origin", "`origin` of the -zone next to it, for relative names when the file has no $ORIGIN", zf.origin)
	fs.StringVar(&o.metrics, "metrics", "", "serve Prometheus metrics at http://`address`/metrics")
	fs.StringVar(&o.bindFile, "bind-rate-limit", "", "BIND rate-limit clause `file` applied over the flags, re-read on SIGHUP")
	fs.IntVar(&o.tcpConns, "tcp-conns-per-client", tcplimit.DefaultConnsPerClient, "concurrent TCP connections per IPv4 address or IPv6 /64")
	fs.BoolFunc("kernel-filter", "attach the kernel filter to the UDP socket (default true; false: the Go request limiter only, e.g. under rrlctl attach)", func(v string) error {
		on, err := strconv.ParseBool(v)
		o.noFilter = !on
		return err
	})
	fs.BoolFunc("cookies", "issue and verify DNS server cookies (default true): a resolver that proves its address is judged at it alone, in the kernel or in Go", func(v string) error {
		on, err := strconv.ParseBool(v)
		o.noCookies = !on
		return err
	})
	fs.BoolVar(&o.demo, "demo", false, "serve on loopback and send itself legitimate traffic and a spoofed flood, then print a report")
	fs.DurationVar(&o.demoDur, "demo-duration", 10*time.Second, "how long the -demo traffic runs")
	fs.Float64Var(&o.demoRate, "demo-flood-rate", 10000, "flood packets per second in -demo")
	fs.IntVar(&o.demoClients, "demo-clients", 8, "legitimate resolvers in -demo, 20 queries per second each")
	// Every keyword of rrl.Config is a flag, found by rrl.ConfigKeywords: a keyword
	// added to the library needs no change here.
	check := rrl.NewConfig() // validates values as they are parsed
	defaults := map[string]string{}
	for _, kv := range check.Values() {
		defaults[kv[0]] = kv[1]
	}
	for _, kw := range rrl.ConfigKeywords() {
		set := func(v string) error {
			if err := check.SetValue(kw, v); err != nil {
				var ce *rrl.ConfigError
				if errors.As(err, &ce) && ce.Value != v {
					// A secret, which the error does not quote, but the flag
					// package would: the error is given after parsing.
					if o.secretErr == nil {
						o.secretErr = err
					}
					return nil
				}
				return err
			}
			o.settings = append(o.settings, [2]string{kw, v})
			return nil
		}
		usage := "rrl " + kw + " (see rrl.Config)"
		if kw == "cookie-secret" {
			usage = "rrl cookie-secret: the site's server cookie secret, 32 hex digits (shown by ps: prefer cookie-secret in -bind-rate-limit FILE)"
		}
		if d := defaults[kw]; d == "true" || d == "false" {
			fs.BoolFunc(kw, usage, set) // report-only: -report-only alone is true
		} else {
			fs.Func(kw, usage, set)
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.secretErr != nil {
		return nil, o.secretErr
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if err := zf.done(); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) { o.listenSet = o.listenSet || f.Name == "listen" })
	if o.demoDur <= 0 || o.demoRate < 0 || o.demoClients < 1 {
		return nil, errors.New("-demo-duration, -demo-flood-rate and -demo-clients must be positive")
	}
	return o, nil
}

// demoSettings are the demo's rrl settings, applied before the flags: five answers
// per second per client network and name (BIND's usual advice), and a request limit
// well above what a legitimate resolver sends, enforced on UDP by the request limiter
// (kernel filter or Go Limiter) in front of the server.
var demoSettings = [][2]string{{"responses-per-second", "5"}, {"requests-per-second", "100"}, {"slip-ratio", "2"}}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "authserver: %v\n", err)
		return 2
	}
	cfg := rrl.NewConfig()
	if o.demo {
		for _, kv := range demoSettings {
			cfg.SetValue(kv[0], kv[1])
		}
		if !o.listenSet {
			o.listen = "127.0.0.1:0"
		}
	}
	for _, kv := range o.settings {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			fmt.Fprintf(stderr, "authserver: %v\n", err)
			return 2
		}
	}
	z, err := openZones(o.zones)
	if err != nil {
		fmt.Fprintf(stderr, "authserver: %v\n", err)
		return 1
	}
	if err := servedZones(cfg, o, z); err != nil {
		fmt.Fprintf(stderr, "authserver: the served zones are learnt from their answers: %v\n", err)
	}
	rl, err := newReloader(o.bindFile, cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "authserver: %v\n", err)
		return 2
	}
	cfg = rl.cfg
	srv, err := startServer(serverConfig{listen: o.listen, zone: z, cfg: cfg, tcpConns: o.tcpConns, metrics: o.metrics, log: stderr, observe: o.demo, noFilter: o.noFilter, noCookies: o.noCookies})
	if err != nil {
		fmt.Fprintf(stderr, "authserver: %v\n", err)
		return 1
	}
	rl.watch(ctx, srv, nil)
	status := 0
	if o.demo {
		res, err := runDemo(ctx, srv, demoOptions{duration: o.demoDur, floodRate: o.demoRate, clients: o.demoClients, progress: stderr})
		if err != nil {
			fmt.Fprintf(stderr, "authserver: demo: %v\n", err)
			status = 1
		} else {
			res.print(stdout, cfg)
		}
	} else {
		fmt.Fprintf(stderr, "authserver: serving %s on %s (UDP and TCP); SIGINT or SIGTERM to stop\n", z.origins(), srv.addr)
		<-ctx.Done()
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.shutdown(sctx); err != nil {
		fmt.Fprintf(stderr, "authserver: shutdown: %v\n", err)
		status = 1
	}
	return status
}

// serverConfig is what startServer needs.
type serverConfig struct {
	listen    string
	zone      dns.Handler // a *zone or a *zoneSet
	cfg       *rrl.Config
	tcpConns  int
	metrics   string    // "" for none
	log       io.Writer // the start-up lines
	observe   bool      // count what reaches clients, for the demo
	noFilter  bool      // no kernel filter: the Go request limiter only
	noCookies bool      // no DNS server cookies
}

// server is a running authserver.
type server struct {
	addr       string // host:port of both transports
	udp        *net.UDPConn
	protection *rrl.Protection
	rrl        *rrl.RRL
	filter     *rrl.Filter
	limiter    *rrl.Limiter // nil with the eBPF filter
	handler    *rrl.Handler
	tcp        *tcplimit.Listener
	observer   *observer // nil unless observing

	udpSrv, tcpSrv *dns.Server
	httpSrv        *http.Server
	errc           chan error
}

// startServer opens the sockets, protects them and starts serving; it returns once
// both transports are ready.
func startServer(c serverConfig) (*server, error) {
	udp, ln, err := listenBoth(c.listen)
	if err != nil {
		return nil, err
	}
	s := &server{addr: udp.LocalAddr().String(), udp: udp, errc: make(chan error, 3)}
	var zone dns.Handler = c.zone
	if c.observe {
		s.observer = new(observer)
		zone = s.observer.inner(zone)
	}
	opts := []rrl.Option{rrl.WithTCPConnsPerClient(c.tcpConns)}
	if c.noFilter {
		opts = append(opts, rrl.WithoutFilter())
	}
	if c.noCookies {
		opts = append(opts, rrl.WithoutCookies())
	}
	p, err := rrl.Protect(udp, zone, c.cfg, opts...)
	if err != nil {
		udp.Close()
		ln.Close()
		return nil, err
	}
	fmt.Fprintf(c.log, "rrl: %v\n", p.Status())
	s.protection, s.rrl, s.filter, s.limiter, s.handler = p, p.RRL(), p.Filter(), p.Limiter(), p.Handler()
	// Protect's servers come with Handler.ConfigureServer applied: miekg/dns's own
	// replies to malformed queries go through the limits too.
	s.udpSrv, s.tcpSrv = p.UDPServer(), p.TCPServer(ln)
	s.tcp = p.TCPLimiters()[0]
	if c.observe {
		s.observer.next = s.handler
		s.udpSrv.Handler, s.tcpSrv.Handler = s.observer, s.observer
	}
	for _, srv := range []*dns.Server{s.udpSrv, s.tcpSrv} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { s.errc <- srv.ActivateAndServe() }()
		select {
		case <-started:
		case err := <-s.errc:
			s.shutdown(context.Background())
			return nil, err
		}
	}
	if c.metrics != "" {
		if err := s.serveMetrics(c.metrics, c.log); err != nil {
			s.shutdown(context.Background())
			return nil, err
		}
	}
	return s, nil
}

// listenBoth opens UDP and TCP on the same address. For port 0 it tries a few
// ports until the one UDP got is free for TCP too.
func listenBoth(addr string) (*net.UDPConn, net.Listener, error) {
	for try := 0; ; try++ {
		ua, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return nil, nil, err
		}
		udp, err := net.ListenUDP("udp", ua)
		if err != nil {
			return nil, nil, err
		}
		ln, err := net.Listen("tcp", udp.LocalAddr().String())
		if err == nil {
			return udp, ln, nil
		}
		udp.Close()
		if ua.Port != 0 || try == 10 {
			return nil, nil, err
		}
	}
}

// serveMetrics serves the Prometheus endpoint on addr.
func (s *server) serveMetrics(addr string, log io.Writer) error {
	opts := []rrlprom.CollectorOption{rrlprom.CollectHandler(s.handler), rrlprom.CollectTCPLimiter(s.tcp)}
	if s.filter != nil {
		opts = append(opts, rrlprom.CollectFilter(s.filter))
	}
	if s.limiter != nil {
		opts = append(opts, rrlprom.CollectLimiter(s.limiter))
	}
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{
		rrlprom.NewCollector("dns", s.rrl, opts...),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := s.httpSrv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.errc <- err
		}
	}()
	fmt.Fprintf(log, "authserver: metrics on http://%s/metrics\n", ln.Addr())
	return nil
}

// shutdown stops serving, waits for the queries in progress and detaches the
// filter.
func (s *server) shutdown(ctx context.Context) error {
	var errs []error
	for _, srv := range []*dns.Server{s.udpSrv, s.tcpSrv} {
		if srv != nil {
			if err := srv.ShutdownContext(ctx); err != nil && !strings.Contains(err.Error(), "not started") {
				errs = append(errs, err)
			}
		}
	}
	if s.httpSrv != nil {
		errs = append(errs, s.httpSrv.Shutdown(ctx))
	}
	if s.protection != nil {
		// The servers closed the UDP socket: what is left to close are the
		// filter's programs and maps.
		errs = append(errs, s.protection.Close())
	}
	return errors.Join(errs...)
}
