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
// Anything else is an error naming its line, a ConfigError with its Line: an unknown
// option, a value out of range, an address match list element that is not an address
// or prefix (an ACL name such as localhost or any, a negation, a key, a nested list:
// this package has no ACLs), a repeated option, or a missing semicolon or brace.

// ParseBINDRateLimit applies the rate-limit clause in text (the whole clause,
// "rate-limit { ... };", or only the statements between its braces) to a copy of base
// (NewConfig() when nil) and returns it. Options the clause does not set keep base's
// values. An error is a ConfigError with the line (Line above 0).
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
// rate-limit clause that ParseBINDRateLimit reads back into the same settings: the
// options of the keywords BIND has, in the order of Config's documentation, an
// allowance not set (which follows responses-per-second) and an empty exempt-clients
// left out. Settings BIND does not have (requests-per-second, the request levels...)
// are not included, nor is the cookie secret. BIND writes integers: a fractional rate
// is written as it is, and ParseBINDRateLimit refuses it as BIND would.
func FormatBINDRateLimit(cfg *Config) string {
	var b strings.Builder
	b.WriteString("rate-limit {\n")
	for _, k := range keywords {
		if k.bind == "" || k.secret {
			continue
		}
		v, ok := k.get(cfg)
		if !ok {
			continue
		}
		if v = k.bindForm.format(v); v != "" {
			fmt.Fprintf(&b, "\t%s %s;\n", k.bind, v)
		}
	}
	b.WriteString("};\n")
	return b.String()
}

// format writes a value as Values prints it in BIND's syntax of the form; "" for an
// empty list.
func (f bindForm) format(v string) string {
	switch f {
	case bindBoolean:
		if b, _ := strconv.ParseBool(v); b {
			return "yes"
		}
		return "no"
	case bindAddresses:
		var b strings.Builder
		for _, s := range splitList(v) {
			if p, err := netip.ParsePrefix(s); err == nil && p.IsSingleIP() {
				s = p.Addr().String()
			}
			fmt.Fprintf(&b, " %s;", s)
		}
		if b.Len() == 0 {
			return ""
		}
		return "{" + b.String() + " }"
	}
	// An integer: Values may print a large one with an exponent (1e+07).
	if r, err := strconv.ParseFloat(v, 64); err == nil {
		return strconv.FormatFloat(r, 'f', -1, 64)
	}
	return v
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
				return nil, &ConfigError{Line: start, Reason: "comment /* is not closed"}
			}
			line += strings.Count(text[i:i+2+end], "\n")
			i += 2 + end + 2
		case c == '{' || c == '}' || c == ';':
			toks = append(toks, bindToken{text: text[i : i+1], line: line})
			i++
		case c == '"':
			end := strings.IndexAny(text[i+1:], "\"\n")
			if end < 0 || text[i+1+end] != '"' {
				return nil, &ConfigError{Line: line, Reason: "quoted string is not closed on its line"}
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
	return &ConfigError{Line: line, Reason: fmt.Sprintf(format, args...)}
}

// valueError is the error of the value of keyword k's option: value is quoted as the
// clause writes it (never a secret: see cookieSecret), err is SetValue's error if any.
func (p *bindParser) valueError(line int, k keyword, value string, err error, format string, args ...any) error {
	return &ConfigError{Line: line, Keyword: k.name, Value: value, Reason: fmt.Sprintf(format, args...), Err: err}
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
	k, isBIND, known := bindKeyword(kw.text)
	if known && isBIND && k.bindForm == bindAddresses {
		return p.addressList(kw, k)
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
	set := func(value string) error {
		if err := p.cfg.SetValue(k.name, value); err != nil {
			shown := value
			if k.secret {
				shown = redacted
			}
			return p.valueError(v.line, k, shown, err, "%s %s: %v", kw.text, shown, reason(err))
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
	switch {
	case !known:
		return p.errorf(kw.line, "unknown or unsupported option %q", kw.text)
	case !isBIND:
		return set(v.text)
	case k.bindForm == bindBoolean:
		b, ok := bindBool(v.text)
		if !ok || v.quoted {
			return p.valueError(v.line, k, v.text, nil, "%s takes a boolean (yes or no), found %q", kw.text, v.text)
		}
		return set(b)
	}
	if _, err := strconv.ParseUint(v.text, 10, 32); err != nil || v.quoted {
		return p.valueError(v.line, k, v.text, nil, "%s takes an integer, found %q", kw.text, v.text)
	}
	return set(v.text)
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
		return &ConfigError{Line: v.line, Keyword: "cookie-secret", Value: redacted,
			Reason: "cookie-secret: " + reason(err), Err: err}
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

// addressList parses the address match list of k's option kw, "{ element; ... };"
// of addresses and prefixes (exempt-clients).
func (p *bindParser) addressList(kw bindToken, k keyword) error {
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
			return p.valueError(t.line, k, t.text, nil, "%s: want an address or prefix, found %q", kw.text, t.text)
		}
		pfx, err := bindPrefix(t.text)
		if err != nil || t.quoted {
			return p.valueError(t.line, k, t.text, nil, "%s: %q is not an address or prefix (ACL names, negations, keys and nested lists are not supported)", kw.text, t.text)
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
	value := strings.Join(list, " ")
	if err := p.cfg.SetValue(k.name, value); err != nil {
		return p.valueError(kw.line, k, value, err, "%s: %s", kw.text, reason(err))
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
