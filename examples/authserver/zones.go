package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

// zoneArg is one -zone flag: a zone file and the origin for its relative names
// ("" when the file sets $ORIGIN).
type zoneArg struct {
	file, origin string
}

// zoneFlags collects repeated -zone and -origin flags into options.zones. An
// -origin belongs to the -zone next to it: the one given just before it, or, when
// it comes before every -zone not yet paired, the next one (so both
// "-zone F -origin O" and "-origin O -zone F" work, as they did with one zone).
type zoneFlags struct {
	o       *options
	pending string // an -origin waiting for its -zone
	paired  bool   // the last -zone has its -origin
}

func (f *zoneFlags) zone(file string) error {
	if file == "" {
		return errors.New("empty file name")
	}
	f.o.zones = append(f.o.zones, zoneArg{file: file, origin: f.pending})
	f.paired = f.pending != ""
	f.pending = ""
	return nil
}

func (f *zoneFlags) origin(name string) error {
	switch {
	case name == "":
		return errors.New("empty origin")
	case f.pending != "":
		return fmt.Errorf("two -origin flags (%s, %s) without a -zone between them", f.pending, name)
	case len(f.o.zones) > 0 && !f.paired:
		f.o.zones[len(f.o.zones)-1].origin = name
		f.paired = true
	default:
		f.pending = name
	}
	return nil
}

// done reports an -origin that no -zone took.
func (f *zoneFlags) done() error {
	if f.pending != "" {
		return fmt.Errorf("-origin %s without a -zone", f.pending)
	}
	return nil
}

// zoneSet serves several zones: a query goes to the zone with the longest origin
// that holds its name (a DS query at a zone's apex to the zone above it, when that
// one is served too, RFC 4035 section 3.1.4.1); a name in none of them is refused.
type zoneSet struct {
	zones []*zone
}

// openZones loads the zones of args, or the embedded example.test. when there are
// none. Two zones with one origin are an error: which one answers would be a guess.
func openZones(args []zoneArg) (*zoneSet, error) {
	if len(args) == 0 {
		z, err := loadZone(strings.NewReader(demoZone), "", "example.test.zone")
		if err != nil {
			return nil, err
		}
		return &zoneSet{zones: []*zone{z}}, nil
	}
	s := &zoneSet{}
	seen := map[string]string{}
	for _, a := range args {
		z, err := openZoneFile(a)
		if err != nil {
			return nil, err
		}
		if other, dup := seen[z.origin]; dup {
			return nil, fmt.Errorf("%s and %s both hold the zone %s", other, a.file, z.origin)
		}
		seen[z.origin] = a.file
		s.zones = append(s.zones, z)
	}
	return s, nil
}

func openZoneFile(a zoneArg) (*zone, error) {
	f, err := os.Open(a.file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return loadZone(f, a.origin, a.file)
}

// origins returns the zones' origins for the log, in the order given.
func (s *zoneSet) origins() string {
	names := make([]string, len(s.zones))
	for i, z := range s.zones {
		names[i] = z.origin
	}
	return strings.Join(names, ", ")
}

// servedZones gives cfg the zones of s as its zones keyword (the apexes the names
// judge knows from the start and never forgets, docs/names.md), unless the operator
// set zones with a flag of o; a -bind-rate-limit file, applied over cfg, may still set
// them. The root is left out (the keyword refuses it: a zone of its own is the
// default). The error is the keyword's: the zones are then learnt from the server's
// answers, as without the keyword.
func servedZones(cfg *rrl.Config, o *options, s *zoneSet) error {
	for _, kv := range o.settings {
		if kv[0] == "zones" {
			return nil
		}
	}
	var names []string
	for _, z := range s.zones {
		if z.origin != "." {
			names = append(names, z.origin)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return cfg.SetValue("zones", strings.Join(names, " "))
}

// pick returns the zone that answers name (lower case, fully qualified) for
// qtype: the longest origin at or above it, skipping a zone's own apex for DS when
// a zone above is served. With no zone holding the name it returns the first zone,
// which refuses it.
func (s *zoneSet) pick(name string, qtype uint16) *zone {
	var best, above *zone
	for _, z := range s.zones {
		if !dns.IsSubDomain(z.origin, name) {
			continue
		}
		if best == nil || len(z.origin) > len(best.origin) {
			best, above = z, best
		} else if above == nil || len(z.origin) > len(above.origin) {
			above = z
		}
	}
	switch {
	case best == nil:
		return s.zones[0]
	case qtype == dns.TypeDS && name == best.origin && above != nil:
		return above
	}
	return best
}

// ServeDNS answers from the zone pick chooses.
func (s *zoneSet) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	z := s.zones[0]
	if len(req.Question) == 1 {
		q := req.Question[0]
		z = s.pick(strings.ToLower(dns.Fqdn(q.Name)), q.Qtype)
	}
	z.ServeDNS(w, req)
}
