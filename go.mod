module github.com/dnsrake/rrl

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0 // indirect
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/miekg/dns v1.1.73 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
