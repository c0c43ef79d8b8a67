package rrl

import (
	"bytes"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// refLabelHash is labelHash written byte by byte, with its own ASCII folding.
func refLabelHash(seed uint64, label []byte) uint64 {
	h := seed ^ uint64(len(label))
	var w uint64
	for i, c := range label {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		w |= uint64(c) << (8 * (i % 8))
		if i%8 == 7 || i == len(label)-1 {
			h = (h ^ w) * nameMul
			h ^= h >> 31
			w = 0
		}
	}
	return h
}

// refReadQName is a reference for readQName written for clarity: it splits the
// name into labels first, then hashes the suffixes from the root. It returns the
// suffix keys, the end of the question and whether it accepted the message.
func refReadQName(msg []byte, seed uint64) ([]nameKey, int, bool) {
	if len(msg) < 12 || msg[4] != 0 || msg[5] != 1 {
		return nil, 0, false
	}
	var labels [][]byte
	i, wire := 12, 1
	for {
		if i >= len(msg) {
			return nil, 0, false
		}
		l := int(msg[i])
		if l == 0 {
			break
		}
		if l > 63 {
			return nil, 0, false
		}
		wire += 1 + l
		if wire > 255 || i+1+l > len(msg) {
			return nil, 0, false
		}
		labels = append(labels, msg[i+1:i+1+l])
		i += 1 + l
	}
	if i+1+4 > len(msg) {
		return nil, 0, false
	}
	keys := make([]nameKey, len(labels)+1)
	keys[len(labels)] = nameKey(mix64(seed))
	for j := len(labels) - 1; j >= 0; j-- {
		keys[j] = nameKey(mix64(uint64(keys[j+1]) ^ refLabelHash(seed, labels[j])))
	}
	return keys, i + 5, true
}

// wireQuery returns a query message for the name given as raw labels (no
// compression, no escaping), with QTYPE A and QCLASS IN, and extra bytes after it.
func wireQuery(labels [][]byte, extra ...byte) []byte {
	b := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, l := range labels {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	b = append(b, 0, 0, 1, 0, 1)
	return append(b, extra...)
}

// splitName returns the labels of a dotted name without escapes.
func splitName(name string) [][]byte {
	var ls [][]byte
	for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		if l != "" {
			ls = append(ls, []byte(l))
		}
	}
	return ls
}

const testNameSeed = 0x5eed5eed12345678

func mustRead(t *testing.T, msg []byte) *qname {
	t.Helper()
	q := new(qname)
	end, err := readQName(msg, testNameSeed, q)
	if err != nameOK {
		t.Fatalf("readQName(% x): %v", msg, err)
	}
	keys, refEnd, ok := refReadQName(msg, testNameSeed)
	if !ok || end != refEnd || q.labels+1 != len(keys) {
		t.Fatalf("readQName(% x): end %d labels %d; reference %v %d %d", msg, end, q.labels, ok, refEnd, len(keys)-1)
	}
	for i, k := range keys {
		if q.suffix[i] != k {
			t.Fatalf("readQName(% x): suffix %d is %x, reference %x", msg, i, q.suffix[i], k)
		}
	}
	return q
}

func repeatLabel(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }

func TestReadQNameRefuses(t *testing.T) {
	long4 := [][]byte{repeatLabel('a', 63), repeatLabel('b', 63), repeatLabel('c', 63), repeatLabel('d', 61)} // 255 bytes
	many := make([][]byte, 127)                                                                               // 127 one-byte labels: 255 bytes
	for i := range many {
		many[i] = []byte{'a' + byte(i%26)}
	}
	for _, tc := range []struct {
		name string
		msg  []byte
		err  nameErr
		end  int // for nameOK
	}{
		{"root", wireQuery(nil), nameOK, 17},
		{"one label", wireQuery(splitName("test.")), nameOK, 22},
		{"trailing bytes (an OPT record) ignored", wireQuery(splitName("a.test."), 0, 0, 41, 4, 208), nameOK, 24},
		{"255 bytes, four labels", wireQuery(long4), nameOK, 12 + 255 + 4},
		{"255 bytes, 127 labels", wireQuery(many), nameOK, 12 + 255 + 4},
		{"256 bytes", wireQuery(append(long4[:3:3], repeatLabel('d', 62))), nameTooLong, 0},
		{"128 labels", wireQuery(append(many[:127:127], []byte("z"))), nameTooLong, 0},
		{"a 63-byte label", wireQuery([][]byte{repeatLabel('x', 63)}), nameOK, 12 + 65 + 4},
		{"a 64-byte length (01 type)", wireQuery([][]byte{repeatLabel('x', 64)}), nameLabelType, 0},
		{"label type 10", append(wireQuery(nil)[:12], 0x80, 0, 0, 1, 0, 1), nameLabelType, 0},
		{"pointer first", append(wireQuery(nil)[:12], 0xc0, 12, 0, 1, 0, 1), namePointer, 0},
		{"pointer after a label", append(wireQuery(nil)[:12], 1, 'a', 0xc0, 12, 0, 1, 0, 1), namePointer, 0},
		{"no question", func() []byte { b := wireQuery(nil); b[5] = 0; return b }(), nameQuestions, 0},
		{"two questions", func() []byte { b := wireQuery(nil); b[5] = 2; return b }(), nameQuestions, 0},
		{"256 questions", func() []byte { b := wireQuery(nil); b[4] = 1; return b }(), nameQuestions, 0},
		{"header only", wireQuery(nil)[:12], nameShort, 0},
		{"empty", nil, nameShort, 0},
	} {
		q := new(qname)
		end, err := readQName(tc.msg, testNameSeed, q)
		if err != tc.err || end != tc.end {
			t.Errorf("%s: end %d, %v; want %d, %v", tc.name, end, err, tc.end, tc.err)
		}
		_, refEnd, ok := refReadQName(tc.msg, testNameSeed)
		if ok != (tc.err == nameOK) || ok && refEnd != tc.end {
			t.Errorf("%s: the reference says %v, %d", tc.name, ok, refEnd)
		}
		if tc.err == nameOK {
			mustRead(t, tc.msg)
		}
	}
}

// TestReadQNameCutEverywhere: a message cut at any byte before the end of QCLASS is
// refused as short (never read past its end, never accepted); the whole one is read.
func TestReadQNameCutEverywhere(t *testing.T) {
	for _, labels := range [][][]byte{
		nil,
		splitName("www.example.test."),
		{repeatLabel('q', 63), repeatLabel('r', 9), []byte("x")},
		{repeatLabel('a', 63), repeatLabel('b', 63), repeatLabel('c', 63), repeatLabel('d', 61)},
	} {
		msg := wireQuery(labels)
		for cut := range len(msg) {
			// A copy of exactly cut bytes, so that reading past it would panic.
			b := append([]byte(nil), msg[:cut]...)
			if end, err := readQName(b, testNameSeed, new(qname)); err != nameShort {
				t.Errorf("%d labels cut at %d of %d: %d, %v; want %v", len(labels), cut, len(msg), end, err, nameShort)
			}
		}
		mustRead(t, msg)
	}
}

func TestQNameKeys(t *testing.T) {
	read := func(name string) *qname { return mustRead(t, wireQuery(splitName(name))) }
	q := read("X7f3k.WWW.Victim.Test.")
	if q.labels != 4 {
		t.Fatalf("labels %d", q.labels)
	}
	// Case does not matter; the parent, the zone and the root are the keys of those
	// names read on their own.
	for _, tc := range []struct {
		got  nameKey
		name string
	}{
		{q.name(), "x7f3k.www.victim.test."},
		{q.parent(), "www.victim.test."},
		{q.suffix[2], "victim.test."},
		{q.suffix[3], "test."},
		{q.suffix[4], "."},
	} {
		if want := read(tc.name).name(); tc.got != want {
			t.Errorf("key of %s: %x, want %x", tc.name, tc.got, want)
		}
		var p qname
		if !qnameOf(strings.ToUpper(tc.name), testNameSeed, &p) || p.name() != tc.got {
			t.Errorf("qnameOf(%s): %x, want %x", strings.ToUpper(tc.name), p.name(), tc.got)
		}
	}
	if k, ok := q.ancestor(2); !ok || k != read("victim.test.").name() {
		t.Errorf("ancestor(2): %x, %v", k, ok)
	}
	if k, ok := q.ancestor(0); !ok || k != read(".").name() {
		t.Errorf("ancestor(0): %x, %v", k, ok)
	}
	if _, ok := q.ancestor(5); ok {
		t.Error("ancestor(5) of a 4-label name")
	}
	if root := read("."); root.parent() != root.name() || root.labels != 0 {
		t.Errorf("the root's parent: %x, name %x", root.parent(), root.name())
	}
	// Different names, different keys: a dot inside a label is not a boundary,
	// bytes above 0x7f and other punctuation are not folded, length counts.
	distinct := map[nameKey]string{}
	for _, labels := range [][][]byte{
		splitName("a.b."), {[]byte("a.b")}, {[]byte("ab")}, splitName("b.a."),
		{{0xc1}}, {{0xe1}}, {[]byte("@")}, {[]byte("`")}, {[]byte("[")}, {[]byte("{")},
		{[]byte("a")}, {[]byte("a\x00")}, {[]byte("aaaaaaaa")}, {[]byte("aaaaaaaa\x00")},
		{[]byte("a"), []byte("a")}, {[]byte("a"), []byte("a"), []byte("a")}, nil,
	} {
		k := mustRead(t, wireQuery(labels)).name()
		if prev, dup := distinct[k]; dup {
			t.Errorf("%q and %s share key %x", labels, prev, k)
		}
		distinct[k] = string(bytes.Join(labels, []byte("|")))
	}
	// Another seed, other keys.
	var other qname
	readQName(wireQuery(splitName("www.victim.test.")), testNameSeed+1, &other)
	if other.name() == read("www.victim.test.").name() {
		t.Error("the key does not depend on the seed")
	}
	// Escapes in presentation format are the bytes they stand for.
	var esc qname
	if !qnameOf(`a\.b.test.`, testNameSeed, &esc) || esc.name() != mustRead(t, wireQuery([][]byte{[]byte("a.b"), []byte("test")})).name() {
		t.Error(`qnameOf(a\.b.test.) differs from the label "a.b"`)
	}
	for _, bad := range []string{strings.Repeat("abcdefgh.", 29), "a..b."} {
		if qnameOf(bad, testNameSeed, new(qname)) {
			t.Errorf("qnameOf(%q) accepted", bad)
		}
	}
}

func TestReadQNameAllocs(t *testing.T) {
	msg := wireQuery(splitName("x7f3k.www.victim.test."))
	q := new(qname)
	if n := testing.AllocsPerRun(100, func() { readQName(msg, testNameSeed, q) }); n != 0 {
		t.Errorf("readQName allocates %v times", n)
	}
}

// FuzzReadQName checks readQName against the reference on any message, and against
// miekg/dns: an accepted name unpacks to the same labels.
func FuzzReadQName(f *testing.F) {
	f.Add(wireQuery(splitName("www.Example.test.")))
	f.Add(wireQuery(nil))
	f.Add(append(wireQuery(nil)[:12], 1, 'a', 0xc0, 12, 0, 1, 0, 1))
	f.Add(wireQuery([][]byte{repeatLabel('a', 63), repeatLabel('b', 63), repeatLabel('c', 63), repeatLabel('d', 61)}))
	q := new(dns.Msg)
	q.SetQuestion("a.b.c.example.", dns.TypeAAAA)
	q.SetEdns0(1232, true)
	b, _ := q.Pack()
	f.Add(b)
	f.Fuzz(func(t *testing.T, msg []byte) {
		var q qname
		end, err := readQName(msg, testNameSeed, &q)
		keys, refEnd, ok := refReadQName(msg, testNameSeed)
		if ok != (err == nameOK) {
			t.Fatalf("readQName %v, reference %v", err, ok)
		}
		if !ok {
			return
		}
		if end != refEnd || q.labels != len(keys)-1 {
			t.Fatalf("end %d labels %d, reference %d %d", end, q.labels, refEnd, len(keys)-1)
		}
		for i, k := range keys {
			if q.suffix[i] != k {
				t.Fatalf("suffix %d: %x, reference %x", i, q.suffix[i], k)
			}
		}
		name, off, uerr := dns.UnpackDomainName(msg, 12)
		if uerr != nil || off != end-4 {
			t.Fatalf("miekg/dns: %q, %d, %v; readQName ends at %d", name, off, uerr, end)
		}
		var p qname
		if !qnameOf(name, testNameSeed, &p) || p.labels != q.labels || p.suffix != q.suffix {
			t.Fatalf("qnameOf(%q) differs from the wire", name)
		}
	})
}
