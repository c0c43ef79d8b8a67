package rrl

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// BIND's rate-limit clause. ParseBINDRateLimit reads the clause as written in
// named.conf, so that an operator can bring the configuration of a BIND server:
//
//	rate-limit {
//		responses-per-second 5;
//		window 5;
//		exempt-clients { 192.0.2.0/24; 2001:db8::1; };
//	};
//
// The options of BIND 9's clause and their keywords here:
//
//	responses-per-second, referrals-per-second, nodata-per-second,
//	nxdomains-per-second, errors-per-second, all-per-second, qps-scale,
//	window, ipv4-prefix-length, ipv6-prefix-length, max-table-size
//	                                    the keywords of the same names
//	slip N                              slip-ratio
//	log-only BOOLEAN                    report-only (yes, no, true, false, 1, 0)
//	exempt-clients { ELEMENT; ... };    exempt-clients, addresses and prefixes only
//	min-table-size N                    accepted and ignored: it sizes BIND's initial
//	                                    table, and this package allocates its table
//	                                    up to 32 MB in full at once anyway
//
// BIND takes integers for all of them, and so does the parser. The package's own
// keywords (requests-per-second, ipv4-request-levels, capacity, ...; see Config) are
// accepted as well, with one value (quote lists: ipv4-request-levels "32:1 24:1";
// capacity auto;), so that one file can configure the request limiter too; BIND itself
// would refuse them. Comments are
// written as in named.conf: //, # and /* */.
//
// BIND's cookie-secret option (of its options block) is accepted in the clause as an
// extension, as BIND writes it: cookie-secret "HEX"; given once, or twice to accept
// a second secret besides the first (the first makes the cookies). No error message
// quotes a secret.
//
// Anything else is an error naming its line: an unknown option, a value out of range,
// an address match list element that is not an address or prefix (an ACL name such as
// localhost or any, a negation, a key, a nested list: this package has no ACLs), a
// repeated option, or a missing semicolon or brace.

// BINDConfigError is the error of ParseBINDRateLimit: what is wrong and on which line
// (counted from 1).
type BINDConfigError struct {
	Line int
	Msg  string
	Err  error // the SetValue error behind it, if any
}

func (e *BINDConfigError) Error() string {
	return fmt.Sprintf("rrl: rate-limit clause, line %d: %s", e.Line, e.Msg)
}

func (e *BINDConfigError) Unwrap() error { return e.Err }

// ParseBINDRateLimit applies the rate-limit clause in text (the whole clause,
// "rate-limit { ... };", or only the statements between its braces) to a copy of base
// (NewConfig() when nil) and returns it. Options the clause does not set keep base's
// values. See BINDConfigError for errors.
func ParseBINDRateLimit(text string, base *Config) (*Config, error) {
	if base == nil {
		base = NewConfig()
	}
	toks, err := bindTokens(text)
	if err != nil {
		return nil, err
	}
	p := &bindParser{toks: toks, cfg: base.clone(), seen: map[string]bool{}}
	if err := p.clause(); err != nil {
		return nil, err
	}
	return p.cfg, nil
}

// FormatBINDRateLimit returns cfg's response rate limiting settings as a BIND
// rate-limit clause that ParseBINDRateLimit reads back into the same settings. Settings
// BIND does not have (requests-per-second, the request levels...) are not included.
func FormatBINDRateLimit(cfg *Config) string {
	var b strings.Builder
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	b.WriteString("rate-limit {\n")
	line := func(kw, v string) { fmt.Fprintf(&b, "\t%s %s;\n", kw, v) }
	line("responses-per-second", num(cfg.responsesPerSecond))
	for _, o := range []struct {
		kw  string
		v   float64
		set bool
	}{
		{"referrals-per-second", cfg.referralsPerSecond, cfg.referralsSet},
		{"nodata-per-second", cfg.nodataPerSecond, cfg.nodataSet},
		{"nxdomains-per-second", cfg.nxdomainsPerSecond, cfg.nxdomainsSet},
		{"errors-per-second", cfg.errorsPerSecond, cfg.errorsSet},
	} {
		if o.set {
			line(o.kw, num(o.v))
		}
	}
	line("all-per-second", num(cfg.allPerSecond))
	line("qps-scale", num(cfg.qpsScale))
	line("window", strconv.FormatInt(cfg.window, 10))
	line("ipv4-prefix-length", strconv.Itoa(cfg.ipv4PrefixLength))
	line("ipv6-prefix-length", strconv.Itoa(cfg.ipv6PrefixLength))
	line("slip", strconv.Itoa(cfg.slipRatio))
	line("max-table-size", strconv.Itoa(cfg.maxTableSize))
	line("log-only", map[bool]string{true: "yes", false: "no"}[cfg.reportOnly])
	if len(cfg.exempt) > 0 {
		b.WriteString("\texempt-clients {")
		for _, p := range cfg.exempt {
			if p.IsSingleIP() {
				fmt.Fprintf(&b, " %v;", p.Addr())
			} else {
				fmt.Fprintf(&b, " %v;", p)
			}
		}
		b.WriteString(" };\n")
	}
	b.WriteString("};\n")
	return b.String()
}

// bindKeyword returns the keyword of the BIND option named name: a keyword whose
// BIND spelling it is (bind true), or one of this package's extensions. A keyword
// with a BIND spelling of its own is not accepted under this package's name.
func bindKeyword(name string) (k keyword, bind, ok bool) {
	for _, k := range keywords {
		switch {
		case k.bind == name:
			return k, true, true
		case k.bind == "" && k.name == name:
			return k, false, true
		}
	}
	return keyword{}, false, false
}

// bindBool reads a BIND boolean as SetValue's.
func bindBool(v string) (string, bool) {
	b, ok := map[string]string{"yes": "true", "true": "true", "1": "true",
		"no": "false", "false": "false", "0": "false"}[strings.ToLower(v)]
	return b, ok
}

// bindToken is a word, a quoted string (quoted true, without its quotes) or one of
// the punctuation marks { } ;.
type bindToken struct {
	text   string
	quoted bool
	line   int
}

// bindTokens splits text into tokens, dropping comments.
func bindTokens(text string) ([]bindToken, error) {
	var toks []bindToken
	line := 1
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == '\n':
			line++
			i++
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case c == '#' || strings.HasPrefix(text[i:], "//"):
			for i < len(text) && text[i] != '\n' {
				i++
			}
		case strings.HasPrefix(text[i:], "/*"):
			start := line
			end := strings.Index(text[i+2:], "*/")
			if end < 0 {
				return nil, &BINDConfigError{Line: start, Msg: "comment /* is not closed"}
			}
			line += strings.Count(text[i:i+2+end], "\n")
			i += 2 + end + 2
		case c == '{' || c == '}' || c == ';':
			toks = append(toks, bindToken{text: text[i : i+1], line: line})
			i++
		case c == '"':
			end := strings.IndexAny(text[i+1:], "\"\n")
			if end < 0 || text[i+1+end] != '"' {
				return nil, &BINDConfigError{Line: line, Msg: "quoted string is not closed on its line"}
			}
			toks = append(toks, bindToken{text: text[i+1 : i+1+end], quoted: true, line: line})
			i += end + 2
		default:
			j := i
			for j < len(text) && !strings.ContainsRune(" \t\r\n{};\"#", rune(text[j])) &&
				!strings.HasPrefix(text[j:], "//") && !strings.HasPrefix(text[j:], "/*") {
				j++
			}
			toks = append(toks, bindToken{text: text[i:j], line: line})
			i = j
		}
	}
	return toks, nil
}

type bindParser struct {
	toks    []bindToken
	pos     int
	cfg     *Config
	seen    map[string]bool
	secrets []string // the cookie-secret statements' secrets so far
}

func (p *bindParser) errorf(line int, format string, args ...any) error {
	return &BINDConfigError{Line: line, Msg: fmt.Sprintf(format, args...)}
}

// next returns the next token, or an error at the last line for the end of input.
func (p *bindParser) next(want string) (bindToken, error) {
	if p.pos >= len(p.toks) {
		line := 1
		if len(p.toks) > 0 {
			line = p.toks[len(p.toks)-1].line
		}
		return bindToken{}, p.errorf(line, "unexpected end of input, want %s", want)
	}
	t := p.toks[p.pos]
	p.pos++
	return t, nil
}

// expect reads the punctuation mark mark.
func (p *bindParser) expect(mark string) error {
	t, err := p.next("'" + mark + "'")
	if err != nil {
		return err
	}
	if t.text != mark || t.quoted {
		return p.errorf(t.line, "want '%s', found %q", mark, t.text)
	}
	return nil
}

func isMark(t bindToken) bool {
	return !t.quoted && (t.text == "{" || t.text == "}" || t.text == ";")
}

// clause parses "rate-limit { statements };" or bare statements.
func (p *bindParser) clause() error {
	if len(p.toks) > 0 && p.toks[0].text == "rate-limit" && !p.toks[0].quoted {
		p.pos++
		if err := p.expect("{"); err != nil {
			return err
		}
		if err := p.statements(true); err != nil {
			return err
		}
		if err := p.expect(";"); err != nil {
			return err
		}
		if p.pos < len(p.toks) {
			t := p.toks[p.pos]
			return p.errorf(t.line, "%q after the rate-limit clause", t.text)
		}
		return nil
	}
	return p.statements(false)
}

// statements parses options up to the closing brace (braced) or the end of input.
func (p *bindParser) statements(braced bool) error {
	for {
		if p.pos >= len(p.toks) {
			if braced {
				_, err := p.next("'}'")
				return err
			}
			return nil
		}
		t := p.toks[p.pos]
		p.pos++
		if braced && t.text == "}" && !t.quoted {
			return nil
		}
		if isMark(t) || t.quoted {
			return p.errorf(t.line, "want an option name, found %q", t.text)
		}
		kw := t.text
		if kw == "cookie-secret" {
			if err := p.cookieSecret(t); err != nil {
				return err
			}
			continue
		}
		if p.seen[kw] {
			return p.errorf(t.line, "%s given twice", kw)
		}
		p.seen[kw] = true
		if err := p.option(t); err != nil {
			return err
		}
	}
}

// option parses the value of the option named by kw and its semicolon.
func (p *bindParser) option(kw bindToken) error {
	if kw.text == "exempt-clients" {
		return p.exemptClients(kw)
	}
	v, err := p.next("a value")
	if err != nil {
		return err
	}
	if isMark(v) {
		return p.errorf(v.line, "%s needs a value, found %q", kw.text, v.text)
	}
	if err := p.expect(";"); err != nil {
		return err
	}
	set := func(keyword, value string) error {
		if err := p.cfg.SetValue(keyword, value); err != nil {
			return &BINDConfigError{Line: v.line, Msg: fmt.Sprintf("%s %s: %v", kw.text, value, reason(err)), Err: err}
		}
		return nil
	}
	if kw.text == "min-table-size" {
		// Accepted and ignored: see the top of this file.
		if _, err := strconv.ParseUint(v.text, 10, 32); err != nil || v.quoted {
			return p.errorf(v.line, "%s takes an integer, found %q", kw.text, v.text)
		}
		return nil
	}
	k, isBIND, ok := bindKeyword(kw.text)
	switch {
	case !ok:
	case isBIND && k.fromBIND != nil:
		b, ok := k.fromBIND(v.text)
		if !ok || v.quoted {
			return p.errorf(v.line, "%s takes a boolean (yes or no), found %q", kw.text, v.text)
		}
		return set(k.name, b)
	case isBIND:
		if _, err := strconv.ParseUint(v.text, 10, 32); err != nil || v.quoted {
			return p.errorf(v.line, "%s takes an integer, found %q", kw.text, v.text)
		}
		return set(k.name, v.text)
	default:
		return set(k.name, v.text)
	}
	return p.errorf(kw.line, "unknown or unsupported option %q", kw.text)
}

// cookieSecret parses one cookie-secret statement: a secret and its semicolon,
// without ever quoting the secret in an error.
func (p *bindParser) cookieSecret(kw bindToken) error {
	if len(p.secrets) == 2 {
		return p.errorf(kw.line, "cookie-secret given more than twice")
	}
	v, err := p.next("a secret")
	if err != nil {
		return err
	}
	if isMark(v) {
		return p.errorf(v.line, "cookie-secret needs a secret")
	}
	if t, err := p.next("';'"); err != nil {
		return err
	} else if t.text != ";" || t.quoted {
		return p.errorf(t.line, "cookie-secret takes one secret per statement, then ';'")
	}
	p.secrets = append(p.secrets, v.text)
	if err := p.cfg.SetValue("cookie-secret", strings.Join(p.secrets, " ")); err != nil {
		return &BINDConfigError{Line: v.line, Msg: "cookie-secret: " + reason(err), Err: err}
	}
	return nil
}

// reason is the reason of a ConfigError, or err's text.
func reason(err error) string {
	if ce, ok := err.(*ConfigError); ok {
		return ce.Reason
	}
	return err.Error()
}

// exemptClients parses "{ element; ... };" of addresses and prefixes.
func (p *bindParser) exemptClients(kw bindToken) error {
	if err := p.expect("{"); err != nil {
		return err
	}
	var prefixes []netip.Prefix
	for {
		t, err := p.next("an address, a prefix or '}'")
		if err != nil {
			return err
		}
		if t.text == "}" && !t.quoted {
			break
		}
		if isMark(t) {
			return p.errorf(t.line, "exempt-clients: want an address or prefix, found %q", t.text)
		}
		pfx, err := bindPrefix(t.text)
		if err != nil || t.quoted {
			return p.errorf(t.line, "exempt-clients: %q is not an address or prefix (ACL names, negations, keys and nested lists are not supported)", t.text)
		}
		prefixes = append(prefixes, pfx)
		if err := p.expect(";"); err != nil {
			return err
		}
	}
	if err := p.expect(";"); err != nil {
		return err
	}
	list := make([]string, len(prefixes))
	for i, pfx := range prefixes {
		list[i] = pfx.String()
	}
	if err := p.cfg.SetValue("exempt-clients", strings.Join(list, " ")); err != nil {
		return &BINDConfigError{Line: kw.line, Msg: "exempt-clients: " + reason(err), Err: err}
	}
	return nil
}

// bindPrefix reads an address or a prefix. BIND allows host bits in a prefix
// (192.0.2.1/24 means 192.0.2.0/24); so does this.
func bindPrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return pfx.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("bad address %q", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
