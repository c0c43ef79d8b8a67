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
#define LAYOUT_VERSION 10
