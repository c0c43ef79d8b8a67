package rrl

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/dnsrake/rrl/tcplimit"
)

// selfSigned returns a server certificate for name and a pool that trusts it.
func selfSigned(t *testing.T, name string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

func TestTCPLimiterTLSState(t *testing.T) {
	// DNS over TLS with the TLS listener inside the limiter: miekg/dns, and the
	// handler through the rrl Handler, still see the connection's TLS state.
	cert, pool := selfSigned(t, "dns.example.test")
	l := tcplimit.LimitListener(tls.NewListener(listenTCP(t), &tls.Config{Certificates: []tls.Certificate{cert}}), 2)
	inner := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		state := "none"
		if cs, ok := w.(dns.ConnectionStater); ok {
			if s := cs.ConnectionState(); s != nil && s.HandshakeComplete {
				state = tls.VersionName(s.Version)
			}
		}
		m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{state}})
		w.WriteMsg(m)
	})
	testutil.Serve(t, &dns.Server{Listener: l, Net: "tcp-tls", Handler: NewHandler(inner, NewRRL(NewConfig()))})
	c := &dns.Client{Net: "tcp-tls", Timeout: answerWait,
		TLSConfig: &tls.Config{RootCAs: pool, ServerName: "dns.example.test", MinVersion: tls.VersionTLS13}}
	resp, _, err := c.Exchange(query("www.example.test.", dns.TypeTXT, false), l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Answer) != 1 || resp.Answer[0].(*dns.TXT).Txt[0] != "TLS 1.3" {
		t.Errorf("the handler saw TLS state %v, want TLS 1.3", resp.Answer)
	}
	if st := l.Stats(); st.Accepted != 1 {
		t.Errorf("stats %+v", st)
	}
}
