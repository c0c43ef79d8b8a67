package rrlprom_test

import (
	"fmt"
	"strings"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/rrlprom"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// The metrics of an RRL and the Handler in front of a server, for Prometheus.
func ExampleNewCollector() {
	r := rrl.NewRRL(rrl.NewConfig())
	h := rrl.NewHandler(dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {}), r)
	reg := prometheus.NewRegistry()
	reg.MustRegister(rrlprom.NewCollector("dns", r, rrlprom.CollectHandler(h)))
	// An HTTP server would serve reg with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).

	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, mf := range families {
		if strings.HasPrefix(mf.GetName(), "dns_rrl_") {
			fmt.Println(mf.GetName(), mf.GetType(), len(mf.GetMetric()), "series")
		}
	}
	// Output:
	// dns_rrl_accounts GAUGE 1 series
	// dns_rrl_actions_total COUNTER 3 series
	// dns_rrl_debits_total COUNTER 5 series
	// dns_rrl_evictions_total COUNTER 1 series
	// dns_rrl_ip_reasons_total COUNTER 7 series
	// dns_rrl_report_only_total COUNTER 3 series
	// dns_rrl_rt_reasons_total COUNTER 6 series
}
