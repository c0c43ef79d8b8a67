package rrl_test

import (
	"fmt"
	"net"
	"time"

	"github.com/dnsrake/rrl"
)

func ExampleConfig_SetEventFunc() {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cfg := rrl.NewConfig()
	cfg.SetValue("responses-per-second", "5")
	cfg.SetNowFunc(func() time.Time { return now }) // a fake clock, for the example
	cfg.SetEventFunc(func(e rrl.LimitEvent) { fmt.Println(e) })
	r := rrl.NewRRL(cfg)

	client := &net.UDPAddr{IP: net.ParseIP("192.0.2.7"), Port: 4053}
	www := &rrl.ResponseTuple{Class: 1, Type: 1, AllowanceCategory: rrl.AllowanceAnswer, SalientName: "www.example."}
	for range 3 { // 20 answers a second for three seconds
		for range 20 {
			r.Debit(client, www)
		}
		now = now.Add(time.Second)
	}
	now = now.Add(10 * time.Second) // the client goes quiet, and its account recovers
	r.Debit(client, www)
	// Output:
	// limit responses to 192.0.2.0/24 for www.example. A (rate 16/s, limit 5/s)
	// stop limiting responses to 192.0.2.0/24 for www.example. A (rate 4.231/s, limit 5/s, for 13s)
}

func ExampleParseBINDRateLimit() {
	cfg, err := rrl.ParseBINDRateLimit(`
rate-limit {
	responses-per-second 5;  // per client network and name
	window 5;
	log-only yes;            # report-only
	exempt-clients { 192.0.2.53; 2001:db8::/48; };
};`, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(rrl.FormatBINDRateLimit(cfg))

	_, err = rrl.ParseBINDRateLimit("rate-limit {\n\tresponses-per-second 5;\n\texempt-clients { trusted; };\n};", nil)
	fmt.Println(err)
	// Output:
	// rate-limit {
	// 	window 5;
	// 	ipv4-prefix-length 24;
	// 	ipv6-prefix-length 56;
	// 	responses-per-second 5;
	// 	slip 2;
	// 	max-table-size 100000;
	// 	log-only yes;
	// 	exempt-clients { 192.0.2.53; 2001:db8::/48; };
	// 	all-per-second 0;
	// 	qps-scale 0;
	// };
	// rrl: rate-limit clause, line 3: exempt-clients: "trusted" is not an address or prefix (ACL names, negations, keys and nested lists are not supported)
}

// A names event says how many random names the limited zone's flood spread over,
// and from how many client networks, where the limiter counts them (the Go Limiter;
// not the kernel filter, whose events say so).
func ExampleLimitEvent_names() {
	fmt.Println(rrl.LimitEvent{Account: rrl.AccountNames, Name: "victim.test.", Names: 3100, Networks: 200, Rate: 54000, Limit: 2000})
	fmt.Println(rrl.LimitEvent{Account: rrl.AccountNames, Name: "victim.test.", Rate: 54000, Limit: 2000})
	// Output:
	// limit random-subdomain queries under victim.test. (about 3100 names from about 200 networks), names known to exist served (rate 5.4e+04/s, limit 2000/s)
	// limit random-subdomain queries under victim.test. (names and networks not counted), names known to exist served (rate 5.4e+04/s, limit 2000/s)
}
