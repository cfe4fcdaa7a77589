// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* The one parser of an LTP frame, [eth | ipv4 without options | udp |
 * struct ltp_hdr | payload] (ltp_wire.h): ltp_run (ltp_xdp.c) and the
 * capture (ltp_capture.h) both read frames through ltp_parse.
 */
#ifndef LTP_PARSE_H
#define LTP_PARSE_H

#include "ltp_wire.h"

#define L3_OFF   (sizeof(struct ethhdr))
#define L4_OFF   (L3_OFF + sizeof(struct iphdr))
#define LTP_OFF  (L4_OFF + sizeof(struct udphdr))
#define PAY_OFF  (LTP_OFF + sizeof(struct ltp_hdr))

/* The headers of a frame, each checked to lie inside it. */
struct ltp_pkt {
	struct ethhdr *eth;
	struct iphdr *iph;
	struct udphdr *udp;
	struct ltp_hdr *h;     /* NULL: the frame ends before a whole LTP header */
};

/* Zero, with p filled in, for IPv4 UDP without IP options to or from
 * LTP_PORT: an LTP frame (its LTP header may be missing: p->h NULL).
 * Nonzero for any other frame, which is none of LTP's business. */
static __always_inline int ltp_parse(struct xdp_md *ctx, struct ltp_pkt *p)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	struct iphdr *iph = (void *)(eth + 1);
	if ((void *)(iph + 1) > data_end || iph->protocol != IPPROTO_UDP)
		return -1;
	if (iph->ihl != 5)  /* LTP never sends IP options */
		return -1;
	struct udphdr *udp = (void *)(iph + 1);
	if ((void *)(udp + 1) > data_end)
		return -1;
	if (udp->dest != bpf_htons(LTP_PORT) && udp->source != bpf_htons(LTP_PORT))
		return -1;
	struct ltp_hdr *h = (void *)(udp + 1);
	p->eth = eth;
	p->iph = iph;
	p->udp = udp;
	p->h = (void *)(h + 1) > data_end ? NULL : h;
	return 0;
}

#endif /* LTP_PARSE_H */
