// Package rrlprom exports the counters of package rrl's limiters to Prometheus. It
// is a package of its own so that a program using rrl without Prometheus does not
// link the client library.
package rrlprom

import (
	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/tcplimit"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector is a prometheus.Collector exporting the counters of an RRL and,
// optionally, of a Handler, a kernel Filter, a Go Limiter and a TCPLimiter. It reads
// them at each scrape (RRL.GetStats without zeroing, Filter.Stats, ...), so it costs
// nothing between scrapes.
//
// Every label has a small fixed set of values: actions, categories, reasons, cookie
// results, filter drop reasons and request limiter nodes ("ipv4/24", "port", ...; at
// most a dozen). No metric is labelled by client, so an attack cannot grow the
// number of series.
//
// The metrics, each name prefixed by the namespace and "_":
//
//	rrl_debits_total{category}                  Debit calls by response category
//	rrl_actions_total{action}                   Debit verdicts: send, drop, slip
//	rrl_report_only_total{action}               report-only: what Debit would have returned
//	rrl_ip_reasons_total{reason}                Debit's IPReason
//	rrl_rt_reasons_total{reason}                Debit's RTReason
//	rrl_accounts                                accounts in the table
//	rrl_evictions_total                         accounts evicted to make room
//	handler_responses_total{action,category}    what the Handler did with responses
//	handler_badcookie_slips_total               slips written as BADCOOKIE
//	handler_cookie_exempt_total                 UDP responses exempt thanks to a valid server cookie
//	handler_requests_limited_total              queries the Handler's Limiter dropped
//	handler_cookies_total{result}               COOKIE options by CookieResult
//	handler_malformed_total{reason}             queries answered with an error (or not at all)
//	                                            for their form, by reason (HandlerStats.Malformed)
//	filter_mode{mode}                           1 for the attached mode (ebpf, classic)
//	filter_packets_total                        packets the eBPF filter judged
//	filter_passed_total                         packets it delivered
//	filter_not_dns_total                        packets it dropped, unable to follow their headers to UDP
//	filter_dropped_total{reason}                dropped: short, response, reflection, limited
//	                                            (in report-only mode: would have dropped)
//	filter_limited_total{node}                  dropped by the request limiter, by level
//	filter_limit_packets_per_second{node}       each level's limit
//	filter_limited_groups{node}                 groups limited now (Filter.LimitedGroups), by level
//	filter_exempt_total, filter_report_only_total, filter_errors_total
//	filter_slipped_total                        limited queries answered with TC at XDP
//	filter_capacity_queries_per_second          the capacity mode (Config keyword capacity):
//	filter_capacity_overloaded                  capacity, 1 while overloaded, the water level,
//	filter_capacity_water_level                 the arrivals, overloads so far, and 1 when the
//	filter_capacity_demand_queries_per_second   capacity cannot be measured; only with the
//	filter_capacity_overloads_total             mode on (limiter_capacity_*: the same for the
//	filter_capacity_problem                     Go limiter's)
//	limiter_packets_total                       packets the Go Limiter judged
//	limiter_exempt_total                        exempt packets it passed uncounted
//	limiter_limited_total{node}                 packets it refused, by level
//	limiter_limit_packets_per_second{node}      each level's limit
//	tcp_accepted_total                          connections the TCPLimiter accepted
//	tcp_refused_total{reason}                   connections reset: client-limit (refused at
//	                                            accept), total-limit (open ones evicted)
//	tcp_accept_errors_total{reason}             accept failures waited out: descriptors, memory
//	tcp_open_connections, tcp_clients           connections open, clients with one open
//	tcp_max_connections                         the total limit
//
// RRL counters are read without zeroing: a program that also calls
// GetStats(true) makes them go down, which Prometheus takes for a restart.
type Collector struct {
	rrl     *rrl.RRL
	handler *rrl.Handler
	filter  *rrl.Filter
	limiter *rrl.Limiter
	tcp     *tcplimit.Listener

	debits, actions, reportOnly, ipReasons, rtReasons, accounts, evictions *prometheus.Desc

	hResponses, hBadCookie, hExempt, hLimited, hCookies, hMalformed *prometheus.Desc

	fMode, fPackets, fPassed, fNotDNS, fDropped, fLimited, fLimit, fGroups, fExempt, fReportOnly, fErrors *prometheus.Desc
	fCookiePassed, fCookieInvalid, fSlipped                                                               *prometheus.Desc

	lPackets, lExempt, lLimited, lLimit *prometheus.Desc

	fCapacity, lCapacity capacityDescs // capacity.go
	fNames, lNames       namesDescs    // names.go

	tAccepted, tRefused, tAcceptErrors, tOpen, tClients, tMax *prometheus.Desc
}

// CollectorOption adds a source of metrics to a Collector.
type CollectorOption func(*Collector)

// CollectHandler adds the counters of h.
func CollectHandler(h *rrl.Handler) CollectorOption { return func(c *Collector) { c.handler = h } }

// CollectFilter adds the counters of the kernel filter f. In ModeClassic only
// filter_mode is exported (the classic prefilter keeps no counters).
func CollectFilter(f *rrl.Filter) CollectorOption { return func(c *Collector) { c.filter = f } }

// CollectLimiter adds the counters of the Go request limiter l.
func CollectLimiter(l *rrl.Limiter) CollectorOption { return func(c *Collector) { c.limiter = l } }

// CollectTCPLimiter adds the counters of the TCP connection limiter t.
func CollectTCPLimiter(t *tcplimit.Listener) CollectorOption { return func(c *Collector) { c.tcp = t } }

// NewCollector returns a Collector of r's counters (r may be nil when only the
// other sources are wanted), with metric names prefixed by namespace (which may be
// empty). Register it with prometheus.MustRegister or a Registry.
func NewCollector(namespace string, r *rrl.RRL, opts ...CollectorOption) *Collector {
	c := &Collector{rrl: r}
	for _, o := range opts {
		o(c)
	}
	d := func(sub, name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, sub, name), help, labels, nil)
	}
	c.debits = d("rrl", "debits_total", "Debit calls by response category.", "category")
	c.actions = d("rrl", "actions_total", "Debit verdicts.", "action")
	c.reportOnly = d("rrl", "report_only_total", "In report-only mode, the verdicts Debit would have returned.", "action")
	c.ipReasons = d("rrl", "ip_reasons_total", "Debit calls by the client network limits' reason.", "reason")
	c.rtReasons = d("rrl", "rt_reasons_total", "Debit calls by the response account's reason.", "reason")
	c.accounts = d("rrl", "accounts", "Accounts in the response rate limiting table.")
	c.evictions = d("rrl", "evictions_total", "Accounts evicted from the full table.")

	c.hResponses = d("handler", "responses_total", "Responses of the inner handler by what the middleware did (send, drop, slip) and category.", "action", "category")
	c.hBadCookie = d("handler", "badcookie_slips_total", "Slips written as BADCOOKIE rather than truncated.")
	c.hExempt = d("handler", "cookie_exempt_total", "UDP responses sent unlimited because the query had a valid server cookie.")
	c.hLimited = d("handler", "requests_limited_total", "Queries the Go request limiter dropped before the inner handler.")
	c.hCookies = d("handler", "cookies_total", "Queries by the verdict on their COOKIE option.", "result")
	c.hMalformed = d("handler", "malformed_total", "Queries answered with an error rcode, or not at all, because of their form, by reason.", "reason")

	c.fMode = d("filter", "mode", "1 for the protection attached to the socket: ebpf or classic.", "mode")
	c.fPackets = d("filter", "packets_total", "Packets the kernel filter judged.")
	c.fPassed = d("filter", "passed_total", "Packets the kernel filter delivered to the socket.")
	c.fNotDNS = d("filter", "not_dns_total", "Packets the kernel filter dropped because it could not follow their headers to a UDP header (more IPv6 extension headers than it walks, later fragments, cut short).")
	c.fDropped = d("filter", "dropped_total", "Packets the kernel filter dropped (in report-only mode: would have dropped), by reason.", "reason")
	c.fLimited = d("filter", "limited_total", "Packets the kernel request limiter refused, by level.", "node")
	c.fLimit = d("filter", "limit_packets_per_second", "The kernel request limiter's limit per group, by level.", "node")
	c.fGroups = d("filter", "limited_groups", "Source groups the kernel request limiter is limiting now (refused in the last few seconds), by level.", "node")
	c.fExempt = d("filter", "exempt_total", "Packets from exempt clients.")
	c.fReportOnly = d("filter", "report_only_total", "Packets passed only because of report-only.")
	c.fErrors = d("filter", "errors_total", "Internal failures of the kernel filter (packets passed).")
	c.fCookiePassed = d("filter", "cookie_passed_total", "Queries the kernel filter passed on a valid server cookie, judged only against their own address's limit.")
	c.fCookieInvalid = d("filter", "cookie_invalid_total", "Queries whose server cookie did not verify in the kernel filter, judged as without one.")
	c.fSlipped = d("filter", "slipped_total", "Request-limited queries answered at the driver (XDP mode) with a truncated response, so that the client retries over TCP.")

	c.lPackets = d("limiter", "packets_total", "Packets the Go request limiter judged (exempt ones are not).")
	c.lExempt = d("limiter", "exempt_total", "Packets from exempt clients, passed uncounted.")
	c.lLimited = d("limiter", "limited_total", "Packets the Go request limiter refused, by level.", "node")
	c.lLimit = d("limiter", "limit_packets_per_second", "The Go request limiter's limit per group, by level.", "node")
	c.fCapacity, c.lCapacity = newCapacityDescs(d, "filter"), newCapacityDescs(d, "limiter")
	c.fNames, c.lNames = newNamesDescs(d, "filter"), newNamesDescs(d, "limiter")

	c.tAccepted = d("tcp", "accepted_total", "TCP connections accepted.")
	c.tRefused = d("tcp", "refused_total", "TCP connections reset: client-limit when accepted with the client at its limit, total-limit when evicted for a newcomer at the total limit.", "reason")
	c.tAcceptErrors = d("tcp", "accept_errors_total", "Accept failures for want of descriptors or memory, waited out.", "reason")
	c.tOpen = d("tcp", "open_connections", "TCP connections open.")
	c.tClients = d("tcp", "clients", "Clients with at least one open TCP connection.")
	c.tMax = d("tcp", "max_connections", "The limit on open TCP connections in all.")
	return c
}

// Label values.
var (
	labelCategoryNames = [rrl.AllowanceLast]string{"answer", "referral", "nodata", "nxdomain", "error"}
	labelActionNames   = [rrl.ActionLast]string{"send", "drop", "slip"}
	labelIpReasonNames = [rrl.IPLast]string{"ok", "not-configured", "not-reached", "rate-limit", "cache-full", "exempt", "all-rate-limit"}
	labelRtReasonNames = [rrl.RTLast]string{"ok", "not-configured", "not-reached", "rate-limit", "not-udp", "cache-full"}
)

// Describe implements prometheus.Collector. It sends every metric the Collector can
// export, whatever sources it has.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.debits, c.actions, c.reportOnly, c.ipReasons, c.rtReasons, c.accounts, c.evictions,
		c.hResponses, c.hBadCookie, c.hExempt, c.hLimited, c.hCookies, c.hMalformed,
		c.fMode, c.fPackets, c.fPassed, c.fNotDNS, c.fDropped, c.fLimited, c.fLimit, c.fGroups, c.fExempt, c.fReportOnly, c.fErrors,
		c.fCookiePassed, c.fCookieInvalid, c.fSlipped,
		c.lPackets, c.lExempt, c.lLimited, c.lLimit,
		c.tAccepted, c.tRefused, c.tAcceptErrors, c.tOpen, c.tClients, c.tMax,
	} {
		ch <- d
	}
	for _, d := range append(c.fCapacity.all(), c.lCapacity.all()...) {
		ch <- d
	}
	for _, d := range append(c.fNames.all(), c.lNames.all()...) {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if c.rrl != nil {
		st := c.rrl.GetStats(false)
		for i, v := range st.RPS {
			counter(c.debits, float64(v), labelCategoryNames[i])
		}
		for i, v := range st.Actions {
			counter(c.actions, float64(v), labelActionNames[i])
			counter(c.reportOnly, float64(st.ReportOnly[i]), labelActionNames[i])
		}
		for i, v := range st.IPReasons {
			counter(c.ipReasons, float64(v), labelIpReasonNames[i])
		}
		for i, v := range st.RTReasons {
			counter(c.rtReasons, float64(v), labelRtReasonNames[i])
		}
		gauge(c.accounts, float64(st.CacheLength))
		counter(c.evictions, float64(st.Evictions))
	}
	if c.handler != nil {
		st := c.handler.Stats()
		for a := range st.Responses {
			for cat, v := range st.Responses[a] {
				counter(c.hResponses, float64(v), labelActionNames[a], labelCategoryNames[cat])
			}
		}
		counter(c.hBadCookie, float64(st.SlippedBadCookie))
		counter(c.hExempt, float64(st.CookieExempt))
		counter(c.hLimited, float64(st.RequestsLimited))
		if c.handler.Cookies() != nil {
			for r, v := range st.Cookies {
				counter(c.hCookies, float64(v), rrl.CookieResult(r).String())
			}
		}
		for reason, v := range st.Malformed {
			counter(c.hMalformed, float64(v), reason)
		}
	}
	if c.filter != nil {
		c.collectFilter(ch, counter, gauge)
	}
	if c.limiter != nil {
		st := c.limiter.Stats()
		counter(c.lPackets, float64(st.Seen-st.Exempt))
		counter(c.lExempt, float64(st.Exempt))
		for _, n := range st.Nodes {
			counter(c.lLimited, float64(n.Limited), n.Node.String())
			gauge(c.lLimit, n.Limit, n.Node.String())
		}
		c.lCapacity.collect(st.Capacity, counter, gauge)
		c.lNames.collect(st.Names, counter, gauge)
	}
	if c.tcp != nil {
		st := c.tcp.Stats()
		counter(c.tAccepted, float64(st.Accepted))
		counter(c.tRefused, float64(st.Refused), "client-limit")
		counter(c.tRefused, float64(st.Evicted), "total-limit")
		counter(c.tAcceptErrors, float64(st.AcceptErrors[0]), "descriptors")
		counter(c.tAcceptErrors, float64(st.AcceptErrors[1]), "memory")
		gauge(c.tOpen, float64(st.Open))
		gauge(c.tClients, float64(st.Clients))
		gauge(c.tMax, float64(c.tcp.MaxConns()))
	}
}

func (c *Collector) collectFilter(ch chan<- prometheus.Metric, counter, gauge func(*prometheus.Desc, float64, ...string)) {
	st, err := c.filter.Stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.fPackets, err)
		return
	}
	for _, m := range []rrl.FilterMode{rrl.ModeClassic, rrl.ModeEBPF} {
		v := 0.0
		if st.Mode == m {
			v = 1
		}
		gauge(c.fMode, v, m.String())
	}
	if st.Mode != rrl.ModeEBPF {
		return
	}
	counter(c.fPackets, float64(st.Seen))
	counter(c.fPassed, float64(st.Passed))
	counter(c.fNotDNS, float64(st.NotDNS))
	var limited uint64
	for _, n := range st.Nodes {
		counter(c.fLimited, float64(n.Limited), n.Node.String())
		gauge(c.fLimit, n.Limit, n.Node.String())
		limited += n.Limited
	}
	// One series per level with a counter: the node names are the only label
	// values, however many groups are limited.
	if groups, err := c.filter.LimitedGroups(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.fGroups, err)
	} else {
		perNode := map[rrl.LimiterNode]int{}
		for _, g := range groups {
			perNode[g.Node]++
		}
		for _, n := range st.Nodes {
			gauge(c.fGroups, float64(perNode[n.Node]), n.Node.String())
		}
	}
	counter(c.fDropped, float64(st.DroppedShort), "short")
	counter(c.fDropped, float64(st.DroppedResponse), "response")
	counter(c.fDropped, float64(st.DroppedReflection), "reflection")
	counter(c.fDropped, float64(limited), "limited")
	counter(c.fExempt, float64(st.Exempt))
	counter(c.fReportOnly, float64(st.ReportOnly))
	counter(c.fErrors, float64(st.Errors))
	counter(c.fCookiePassed, float64(st.CookiePassed))
	counter(c.fCookieInvalid, float64(st.CookieInvalid))
	counter(c.fSlipped, float64(st.Slipped))
	c.fCapacity.collect(st.Capacity, counter, gauge)
	c.fNames.collect(st.Names, counter, gauge)
}
