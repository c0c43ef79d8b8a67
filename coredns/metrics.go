package coredns

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/coredns/coredns/plugin"
	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/rrlprom"
	"github.com/prometheus/client_golang/prometheus"
)

// The metrics go to Prometheus's default registry, which the prometheus plugin
// serves, as CoreDNS's own plugins' metrics do. Each server block's series carry the
// labels server (its first listen address, e.g. "dns://:53") and zone (its first
// zone); none is labelled by client, so an attack cannot add series.
//
//	coredns_rrl_responses_exceeded_total    responses over their account's limit (dropped
//	                                        or slipped; in report-only mode, counted only),
//	                                        all-per-second included: coredns/rrl's metric
//	coredns_rrl_requests_exceeded_total     queries over requests-per-second, wherever
//	                                        they were refused: kernel, Go limiter, Debit
//	coredns_rrl_rrl_*, coredns_rrl_handler_*, coredns_rrl_filter_*, coredns_rrl_limiter_*
//	                                        the library's counters (rrlprom.Collector)
//
// After a reload a block's counters start again from zero, as after a restart.
const namespace = plugin.Namespace + "_" + Name

var (
	responsesExceeded = prometheus.NewDesc(namespace+"_responses_exceeded_total",
		"Responses exceeding their rate limit (dropped or slipped; counted only in report-only mode).", nil, nil)
	requestsExceeded = prometheus.NewDesc(namespace+"_requests_exceeded_total",
		"Queries exceeding requests-per-second (dropped in the kernel or in Go; counted only in report-only mode).", nil, nil)
)

// source is the metrics of one server block, registered once and kept across
// reloads: registering a new collector with the same series on every reload would
// clash with the old one, which the old instance only unregisters after the new one
// has started.
type source struct {
	cur atomic.Pointer[RRL]
}

var (
	sourcesMu sync.Mutex
	sources   = map[[2]string]*source{}
)

// metricsSource returns the source of the server block (server, zone), registering
// it the first time.
func metricsSource(server, zone string) (*source, error) {
	sourcesMu.Lock()
	defer sourcesMu.Unlock()
	key := [2]string{server, zone}
	if s, ok := sources[key]; ok {
		return s, nil
	}
	s := new(source)
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"server": server, "zone": zone}, prometheus.DefaultRegisterer)
	if err := reg.Register(s); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		return nil, err
	}
	sources[key] = s
	return s, nil
}

// set makes p the instance whose counters s exports.
func (s *source) set(p *RRL) { s.cur.Store(p) }

// clear stops exporting p's counters unless a newer instance has taken its place.
func (s *source) clear(p *RRL) { s.cur.CompareAndSwap(p, nil) }

// Describe implements prometheus.Collector.
func (s *source) Describe(ch chan<- *prometheus.Desc) {
	ch <- responsesExceeded
	ch <- requestsExceeded
	rrlprom.NewCollector(namespace, nil).Describe(ch)
}

// Collect implements prometheus.Collector.
func (s *source) Collect(ch chan<- prometheus.Metric) {
	p := s.cur.Load()
	if p == nil {
		return
	}
	prot := p.prot.Load()
	resp, req := p.exceeded()
	ch <- prometheus.MustNewConstMetric(responsesExceeded, prometheus.CounterValue, float64(resp))
	ch <- prometheus.MustNewConstMetric(requestsExceeded, prometheus.CounterValue, float64(req))
	opts := []rrlprom.CollectorOption{rrlprom.CollectHandler(prot.Handler())}
	if l := prot.Limiter(); l != nil {
		opts = append(opts, rrlprom.CollectLimiter(l))
	}
	if fs := p.socketFilters(); len(fs) > 0 {
		opts = append(opts, rrlprom.CollectFilter(fs[0]))
	}
	rrlprom.NewCollector(namespace, prot.RRL(), opts...).Collect(ch)
}

// exceeded returns coredns/rrl's two counts: responses over their limits and
// queries over requests-per-second.
func (p *RRL) exceeded() (responses, requests uint64) {
	prot := p.prot.Load()
	st := prot.RRL().GetStats(false)
	responses = uint64(st.RTReasons[rrl.RTRateLimit] + st.IPReasons[rrl.IPAllRateLimit])
	requests = uint64(st.IPReasons[rrl.IPRateLimit])
	var limiters []rrl.FilterStats // the request limits, in Go and in each kernel filter
	if l := prot.Limiter(); l != nil {
		limiters = append(limiters, l.Stats())
	}
	for _, f := range p.socketFilters() {
		if fs, err := f.Stats(); err == nil {
			limiters = append(limiters, fs)
		}
	}
	for _, st := range limiters {
		for _, n := range st.Nodes {
			requests += n.Limited
		}
	}
	return responses, requests
}

// socketFilters returns the kernel filter on each of the block's UDP listen
// addresses, in the order of its keys, once each: the filter the Protection of one
// of the blocks served there holds (the last one to take it over). The filter
// metrics show the first.
func (p *RRL) socketFilters() []*rrl.Filter {
	var out []*rrl.Filter
	for _, g := range p.groups {
		for _, m := range slices.Backward(g.members) {
			prot := m.prot.Load()
			if prot == nil {
				continue
			}
			if f := prot.Filter(); f != nil {
				if !slices.Contains(out, f) {
					out = append(out, f)
				}
				break
			}
		}
	}
	return out
}
