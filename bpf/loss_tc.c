// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* loss_tc: random loss injector for the test rig (tc, clsact egress, direct-action).
 *
 * Attached to the switch ports of the rig (`ltp rig`), on egress toward the
 * parameter server (and optionally toward every worker). Each IPv4 UDP or TCP
 * packet is dropped with probability p = loss_cfg[0] / 2^32, drawn with
 * bpf_get_prandom_u32(). Everything else (ARP, IPv6, ICMP, ...) always passes
 * and is counted apart, so the rig stays reachable (neighbour resolution and
 * ping keep working) whatever p is.
 *
 * Counting is per segment: a GSO packet (one skb carrying several TCP
 * segments) is dropped or passed as a whole and counts gso_segs times, so
 * dropped / (dropped + passed) estimates p for TCP too.
 *
 * A packet it keeps goes on to the port's next filter (TC_ACT_UNSPEC: a
 * node's shared link redirects it there, dataplane/rig/netlink.py
 * redirect_through), and with none it is sent as TC_ACT_OK would.
 */
/* The program's license string (bcc's footer puts it in the license
 * section): the dual licence of the SPDX line, GPL-compatible for the kernel. */
#define BPF_LICENSE Dual BSD/GPL

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>

#define LOSS_DROPPED 0
#define LOSS_PASSED  1
#define LOSS_OTHER   2
#define LOSS_NSTATS  3

/* loss_cfg[0]: drop threshold, p * 2^32 (0: never drop).
 * Written by Python (dataplane/rig/lossinject.py: write, for Rig.set_loss, via
 * the pinned map); read by loss_tc. */
BPF_ARRAY(loss_cfg, __u32, 1);

/* loss_stats[i]: packets (segments) dropped, passed, and not eligible
 * (not IPv4 UDP/TCP, always passed). Written by loss_tc; read by Python
 * (dataplane/rig/lossinject.py: counters sums the per-CPU values). */
BPF_PERCPU_ARRAY(loss_stats, __u64, LOSS_NSTATS);

static __always_inline void count(int idx, __u64 n)
{
	__u64 *c = loss_stats.lookup(&idx);

	if (c)
		*c += n;
}

int loss_tc(struct __sk_buff *skb)
{
	__u8 proto = 0;
	__u32 zero = 0, *thr;
	__u64 segs;

	if (skb->protocol != bpf_htons(ETH_P_IP) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, protocol),
			       &proto, 1) < 0 ||
	    (proto != IPPROTO_UDP && proto != IPPROTO_TCP)) {
		count(LOSS_OTHER, 1);
		return TC_ACT_UNSPEC;
	}
	segs = skb->gso_segs ? skb->gso_segs : 1;
	thr = loss_cfg.lookup(&zero);
	if (thr && *thr && bpf_get_prandom_u32() < *thr) {
		count(LOSS_DROPPED, segs);
		return TC_ACT_SHOT;
	}
	count(LOSS_PASSED, segs);
	return TC_ACT_UNSPEC;
}
