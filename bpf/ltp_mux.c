// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* ltp_mux: one interface shared by several LTP endpoints (ranks).
 *
 * A device carries one XDP program. Where several ranks of a host share a
 * NIC, this program is the one attached, and each rank's own ltp_xdp
 * (compiled with LTP_PORT = the rank's UDP port) sits in a seat of
 * ltp_mux_progs: an IPv4 UDP frame to a port a seat holds (ltp_mux_ports)
 * is tail-called into that rank's program, which treats it as if it were
 * attached itself (DATA stored and turned into its ACK with XDP_TX, ACKs
 * recorded, the clock). Every other frame passes up untouched, as does one
 * whose seat was emptied in between (the tail call then falls through).
 *
 * Each rank keeps its own program and maps: a rank that dies frees its own
 * seat and memory, never its neighbours' (dataplane/xdp/mux.py holds the
 * seats and sweeps a dead owner's). ltp_mux_seats says who holds each seat;
 * ltp_mux_count counts tail calls tried, frames passed for want of a seat,
 * and tail calls that fell through (seat held, or emptied meanwhile).
 */
#define BPF_LICENSE Dual BSD/GPL

#include <uapi/linux/bpf.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>

#ifndef MUX_SEATS
#define MUX_SEATS 64
#endif

/* Who holds a seat: its process, its UDP port, the process's start time
 * (clock ticks after boot, /proc/<pid>/stat: with the pid, one process). */
struct ltp_mux_seat {
	__u32 pid;
	__u16 port;
	__u16 pad;
	__u64 start;
};

#define MUX_DISPATCHED  0    /* tail calls tried */
#define MUX_NO_SEAT     1    /* an IPv4 UDP frame to a port no seat holds */
#define MUX_FELL        2    /* the tail call fell through, the seat still held */
#define MUX_EMPTIED     3    /* ... the seat emptied meanwhile (its holder left) */
#define MUX_COUNTERS    4

BPF_PROG_ARRAY(ltp_mux_progs, MUX_SEATS);
BPF_HASH(ltp_mux_ports, __u16, __u32, MUX_SEATS);                 /* port (host order) -> seat */
BPF_HASH(ltp_mux_seats, __u32, struct ltp_mux_seat, MUX_SEATS);   /* seat -> its holder */
BPF_PERCPU_ARRAY(ltp_mux_count, __u64, MUX_COUNTERS);

static __always_inline void mux_count(__u32 which)
{
	__u64 *n = ltp_mux_count.lookup(&which);
	if (n)
		*n += 1;
}

int ltp_mux(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	struct iphdr *iph = (void *)(eth + 1);
	if ((void *)(iph + 1) > data_end || iph->protocol != IPPROTO_UDP || iph->ihl != 5)
		return XDP_PASS;
	if (iph->frag_off & bpf_htons(0x1fff))   /* a later fragment: no UDP header */
		return XDP_PASS;
	struct udphdr *udp = (void *)(iph + 1);
	if ((void *)(udp + 1) > data_end)
		return XDP_PASS;
	__u16 port = bpf_ntohs(udp->dest);
	__u32 *seat = ltp_mux_ports.lookup(&port);
	if (!seat) {
		mux_count(MUX_NO_SEAT);
		return XDP_PASS;
	}
	__u32 s = *seat;
	mux_count(MUX_DISPATCHED);
	ltp_mux_progs.call(ctx, s);
	/* here only when the seat's program is gone (the seats map is read
	 * here too, which also ties it to this program: mux.py finds the
	 * maps of an attached mux by the program's map ids) */
	mux_count(ltp_mux_seats.lookup(&s) ? MUX_FELL : MUX_EMPTIED);
	return XDP_PASS;
}
