// Server cookies (cookie.go): a valid one proves the source address.
#pragma once

#include "dns.h"

// ---- Server cookies (cookie.go) ----

#define COOKIE_OPTION 10
#define COOKIE_LEN 24             // client cookie (8) and RFC 9018 server cookie (16)
#define COOKIE_VERSION 1
#define COOKIE_MAX_AGE 3600
#define COOKIE_MAX_FUTURE 300
#define OPT_TYPE 41
#define OPT_FIXED_LEN 11          // root name, type, class, TTL, RDLENGTH
// The smallest query that can hold a cookie: header, root question, OPT, option.
#define MIN_COOKIE_QUERY (DNS_HEADER_LEN + 5 + OPT_FIXED_LEN + 4 + COOKIE_LEN)
#define MAX_OPTIONS 32            // options looked at, the cookie included

struct sip_key {
	__u64 k0, k1;             // the CookieSecret's two little-endian halves
};

// The server cookie secrets and the wall clock, written by the Go side
// (kernelcookie.go) into a map of their own: rotating secrets and updating the
// settings never write the same map.
struct cookie_secrets {
	__u32 layout_version;
	__u8 has_current;         // 0: look for no cookie
	__u8 has_previous;
	__u16 pad;
	__s64 wall_offset_ns;     // CLOCK_REALTIME minus the program's clock (clock_now)
	struct sip_key current;
	struct sip_key previous;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cookie_secrets);
} rrl_cookie_secrets SEC(".maps");


#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define le64(x) (x)
#else
#define le64(x) __builtin_bswap64(x)
#endif

#define ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

struct sip_state {
	__u64 v0, v1, v2, v3;
};

#define SIPROUND                                                        \
	do {                                                            \
		v0 += v1; v1 = ROTL64(v1, 13); v1 ^= v0; v0 = ROTL64(v0, 32); \
		v2 += v3; v3 = ROTL64(v3, 16); v3 ^= v2;                \
		v0 += v3; v3 = ROTL64(v3, 21); v3 ^= v0;                \
		v2 += v1; v1 = ROTL64(v1, 17); v1 ^= v2; v2 = ROTL64(v2, 32); \
	} while (0)

// sip_word takes one message word w: two rounds between the xors; the finalisation
// is sip_word(s, 0) twice (v2 flipped first). A subprogram, so that siphash24 is
// one copy of the rounds and no loop: for a process without CAP_PERFMON the
// verifier also walks the path a mispredicted loop exit would take, and on a loop
// whose turns differ (which word a turn takes) it does not come back from it.
static __noinline void sip_word(struct sip_state *s, __u64 w)
{
	__u64 v0 = s->v0, v1 = s->v1, v2 = s->v2, v3 = s->v3 ^ w;
	SIPROUND;
	SIPROUND;
	s->v0 = v0 ^ w; s->v1 = v1; s->v2 = v2; s->v3 = v3;
}

// siphash24 is SipHash-2-4 keyed by k over a message of 2 or 4 (v4 or not) 8-byte
// little-endian words m and the final word last (the tail bytes and the length in
// the top byte). A subprogram: every attached socket pays for the program's size,
// and only queries that carry a server cookie call it.
static __noinline __u64 siphash24(const struct sip_key *k, const __u64 *m, int v4, __u64 last)
{
	struct sip_state s = {
		.v0 = k->k0 ^ 0x736f6d6570736575ULL,
		.v1 = k->k1 ^ 0x646f72616e646f6dULL,
		.v2 = k->k0 ^ 0x6c7967656e657261ULL,
		.v3 = k->k1 ^ 0x7465646279746573ULL,
	};
	sip_word(&s, m[0]);
	sip_word(&s, m[1]);
	if (!v4) {
		sip_word(&s, m[2]);
		sip_word(&s, m[3]);
	}
	sip_word(&s, last);
	s.v2 ^= 0xff;
	sip_word(&s, 0);
	sip_word(&s, 0);
	return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

enum cookie_verdict {
	COOKIE_NONE,    // no server cookie of the RFC 9018 size: judged as today
	COOKIE_PROVEN,  // a server cookie Cookies.Verify finds valid
	COOKIE_INVALID, // a server cookie that is not: judged as without one
};

// find_cookie looks for the query's COOKIE option in an OPT record right after the
// only question (question_end). It returns 0 when there is none where it
// looks, else the offset of the option's data from the end of the DNS header in the
// low 16 bits and the option's length (capped at 255) above them.
//
// The question must end, and the OPT record start, within the first COOKIE_SCAN bytes
// after the header, all of which the packet must hold; each label length, the OPT
// record's fixed part and each option's header are read from the packet where they
// are: so a cookie is found anywhere in an OPT record of any length (a padded query's
// OPT ends well past byte 512). Nothing is indexed by a value the verifier cannot
// know (see question_end).
static __always_inline __u32 find_cookie(struct rrl_ctx *ctx, __u32 dns_off, __u32 dns_len)
{
	if (dns_len < MIN_COOKIE_QUERY)
		return 0;
	// Indexes are 64-bit: the verifier keeps the bounds of a 64-bit register
	// through the checks, not those of a 32-bit one zero-extended into a copy.
	__u64 len = dns_len - DNS_HEADER_LEN; // the message after its header
	__u64 n = len;
	if (n > COOKIE_SCAN)
		n = COOKIE_SCAN;
	barrier_var(n);
	if (n < MIN_COOKIE_QUERY - DNS_HEADER_LEN || n > COOKIE_SCAN)
		return 0;
	__u8 b[OPT_FIXED_LEN];
	if (load_net(ctx, dns_off + DNS_HEADER_LEN + n - 1, b, 1))
		return 0;
	__u64 i = (__u32)question_end(ctx, dns_off + DNS_HEADER_LEN, n);
	if (!i)
		return 0;
	if (i + OPT_FIXED_LEN > n)
		return 0;
	if (load_net(ctx, dns_off + DNS_HEADER_LEN + i, b, OPT_FIXED_LEN))
		return 0;
	if (b[0] != 0 || b[1] != 0 || b[2] != OPT_TYPE)
		return 0;
	__u64 o = i + OPT_FIXED_LEN;
	__u64 end = o + ((__u64)b[9] << 8 | b[10]);
	if (end > len)
		return 0;
#pragma clang loop unroll(disable)
	for (int k = 0; k < MAX_OPTIONS; k++) {
		bounded_loop(k);
		if (o + 4 > end)
			return 0;
		__u8 h[4];
		if (load_net(ctx, dns_off + DNS_HEADER_LEN + o, h, sizeof(h)))
			return 0;
		__u64 code = (__u64)h[0] << 8 | h[1];
		__u64 olen = (__u64)h[2] << 8 | h[3];
		if (code == COOKIE_OPTION) {
			if (o + 4 + olen > end)
				return 0;
			return (o + 4) | (olen > 255 ? 255 : olen) << 16;
		}
		o += 4 + olen;
	}
	return 0;
}

// check_cookie judges the server cookie of a query whose DNS header is at dns_off
// (bits 32..63 of where), dns_len bytes long (bits 1..31), from source (hi, lo), IPv4
// if bit 0 of where is set, at now on the program's clock, as Cookies.Verify does:
// version 1, a timestamp no more than COOKIE_MAX_AGE seconds old and
// COOKIE_MAX_FUTURE ahead of the wall clock, and SipHash-2-4 over client cookie |
// version | reserved | timestamp | address with the current or the previous secret.
//
// A global function: the verifier checks it once, on its own, instead of walking
// every label count at every place the caller's state differs (which took a second
// of loading), and the code that only cookie queries run stays out of the caller's
// registers.
__noinline int check_cookie(struct rrl_ctx *ctx, __u64 where, __u64 now, __u64 hi, __u64 lo)
{
	__u32 zero = 0;
	__u32 dns_off = where >> 32, dns_len = (__u32)where >> 1;
	struct cookie_secrets *sec = bpf_map_lookup_elem(&rrl_cookie_secrets, &zero);
	if (!sec || !sec->has_current)
		return COOKIE_NONE;
	__u32 found = find_cookie(ctx, dns_off, dns_len);
	__u32 at = found & 0xffff, len = found >> 16;
	if (!at)
		return COOKIE_NONE;
	if (len != COOKIE_LEN)
		// Other server cookie sizes RFC 7873 allows are not ours (CookieBad).
		return len >= 16 && len <= 40 ? COOKIE_INVALID : COOKIE_NONE;
	__u64 ck[3];
	if (load_net(ctx, dns_off + DNS_HEADER_LEN + at, ck, sizeof(ck)))
		return COOKIE_NONE;
	__u64 w = le64(ck[1]); // version, reserved, timestamp
	if ((w & 0xff) != COOKIE_VERSION)
		return COOKIE_INVALID;
	__u32 wall = (__u64)((__s64)now + sec->wall_offset_ns) / 1000000000ULL;
	__s32 age = (__s32)(wall - __builtin_bswap32((__u32)(w >> 32)));
	if (age > COOKIE_MAX_AGE || age < -COOKIE_MAX_FUTURE)
		return COOKIE_INVALID;
	__u64 m[4] = {le64(ck[0]), w};
	__u64 last;
	int v4 = where & 1;
	if (v4) {
		// An IPv4 client is hashed as 4 bytes, from a dual-stack socket too.
		last = (__u64)__builtin_bswap32((__u32)lo) | (20ULL << 56);
	} else {
		m[2] = __builtin_bswap64(hi);
		m[3] = __builtin_bswap64(lo);
		last = 32ULL << 56;
	}
	__u64 want = le64(ck[2]);
	if (siphash24(&sec->current, m, v4, last) == want)
		return COOKIE_PROVEN;
	if (sec->has_previous && siphash24(&sec->previous, m, v4, last) == want)
		return COOKIE_PROVEN;
	return COOKIE_INVALID;
}

// may_hold_cookie is the cheap test every query takes: one question, no answers or
// authority, an additional record, and room for a cookie.
static __always_inline int may_hold_cookie(const struct packet *p)
{
	return (p->dns_counts >> 16) == 0x000100000000ULL && (p->dns_counts & 0xffff) &&
	       p->dns_len >= MIN_COOKIE_QUERY;
}
