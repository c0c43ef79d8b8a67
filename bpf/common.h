// What every part of the rrl programs includes. The programs are built from these
// headers once per hook: filter_bpf.c (the socket filter) and xdp_bpf.c (XDP), each
// defining the hook before including anything (see ctx.h).
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// The map layout both programs share with the Go side (layoutVersion in
// filter_objects.go): any change to a map's key or value moves it.
#define LAYOUT_VERSION 11

// ptr_add moves the pointer p by the constant n bytes with an addition of an
// immediate, which the verifier takes on every path without Spectre v1 masking.
// Written in C, clang turns moves by different constants on different paths (a loop
// over an array, a choice between two members) into one addition of a register,
// which the verifier refuses to a process without CAP_PERFMON: it masks each pointer
// addition with a single limit, so the register must hold the same bound on every
// path that reaches it.
// bounded_loop(i) goes first in the body of a loop over i whose exit test is
// i < bound: it hides i from clang, which would otherwise test i != bound instead.
// For a process without CAP_PERFMON the verifier also walks the path a mispredicted
// exit test would take, with i unknown; i < bound bounds i on that path within a few
// turns, i != bound never does, and the verifier gives up.
#define bounded_loop(i) barrier_var(i)

#define ptr_add(p, n) asm volatile("%[ptr] += %[off]" : [ptr] "+r"(p) : [off] "i"(n))
