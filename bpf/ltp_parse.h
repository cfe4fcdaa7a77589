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

/* The headers of a frame. */
struct ltp_pkt {
	struct ethhdr *eth;
	struct iphdr *iph;
	struct udphdr *udp;
	struct ltp_hdr *h;     /* inside the frame only when ltp_parse returned LTP_WHOLE */
};

#define LTP_WHOLE  0           /* ltp_parse: an LTP frame with a whole LTP header */
#define LTP_SHORT  1           /* ... an LTP frame that ends inside its LTP header */
#define LTP_OTHER  (-1)        /* ... any other frame, none of LTP's business */

/* Parse the frame at ctx into p. An LTP frame is IPv4 UDP without IP
 * options to or from LTP_PORT; LTP_WHOLE if its LTP header is whole,
 * LTP_SHORT if not (p->h then points past the frame's end); LTP_OTHER
 * for any other frame (p untouched past what was checked). */
static __always_inline int ltp_parse(struct xdp_md *ctx, struct ltp_pkt *p)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return LTP_OTHER;
	struct iphdr *iph = (void *)(eth + 1);
	if ((void *)(iph + 1) > data_end || iph->protocol != IPPROTO_UDP)
		return LTP_OTHER;
	if (iph->ihl != 5)  /* LTP never sends IP options */
		return LTP_OTHER;
	/* A fragment after the first has no UDP header: what sits where its
	 * ports would be is payload, so it is never LTP's, whatever it reads.
	 * (A first fragment to the port is LTP's, and malformed: ltp_run.) */
	if (iph->frag_off & bpf_htons(0x1fff))
		return LTP_OTHER;
	struct udphdr *udp = (void *)(iph + 1);
	if ((void *)(udp + 1) > data_end)
		return LTP_OTHER;
	if (udp->dest != bpf_htons(LTP_PORT) && udp->source != bpf_htons(LTP_PORT))
		return LTP_OTHER;
	struct ltp_hdr *h = (void *)(udp + 1);
	p->eth = eth;
	p->iph = iph;
	p->udp = udp;
	p->h = h;
	return (void *)(h + 1) > data_end ? LTP_SHORT : LTP_WHOLE;
}

#endif /* LTP_PARSE_H */
