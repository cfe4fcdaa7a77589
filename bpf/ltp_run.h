// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* ltp_run, the program proper (ltp_xdp.c runs it between the capture's two
 * halves): parse the frame, pass what is not LTP, drop what no LTP packet
 * may be, and hand DATA to on_data, ACKs to on_ack.
 */
#ifndef LTP_RUN_H
#define LTP_RUN_H

#include "ltp_util.h"
#include "ltp_parse.h"
#include "ltp_data.h"
#include "ltp_ack.h"

/* The verdict on the frame at ctx; now: bpf_ktime_get_ns as read already
 * for this frame, or 0. */
static __always_inline int ltp_run(struct xdp_md *ctx, __u64 now)
{
	struct ltp_pkt p;
	int parsed = ltp_parse(ctx, &p);
	if (parsed == LTP_OTHER) {
		count(LTP_C_PASS);
		return XDP_PASS;
	}
	/* From here on the packet is addressed to or from our port. */
	if (p.iph->frag_off & bpf_htons(0x3fff))
		return drop(LTP_C_MALFORMED, 0);
	if (parsed != LTP_WHOLE)
		return drop(LTP_C_MALFORMED, 0);
	struct ltp_hdr *h = p.h;
	if (h->magic != bpf_htons(LTP_MAGIC))
		return drop(LTP_C_BAD_MAGIC, h);
	if (h->version != LTP_VERSION)
		return drop(LTP_C_BAD_VERSION, h);
	__u32 zero = 0;
	struct ltp_cfg *cfg = ltp_cfg.lookup(&zero);
	if (!cfg)
		return XDP_DROP;
	if (cfg->job && bpf_ntohl(h->job) != cfg->job)
		return drop(LTP_C_FOREIGN_JOB, h);

	/* DATA comes to our port. An ACK comes back to the port our DATA left
	 * from: our own where the endpoint's socket holds it (every endpoint's,
	 * and a rank's on a shared device: ltp_mux.c), else one the kernel
	 * chose (our port taken), the ACK then from the receiver's port, which
	 * ltp_parse admits only where it is ours too (a seated peer's is not:
	 * control/transport/udpsock.py warns). */
	if (h->type == LTP_T_DATA && p.udp->dest == bpf_htons(LTP_PORT))
		return on_data(ctx, &p, cfg, now);
	if (h->type == LTP_T_ACK)
		return on_ack(ctx, h);
	if (h->type >= LTP_T_CTRL_MIN && h->type <= LTP_T_CTRL_MAX) {
		count(LTP_C_CTRL);
		return XDP_PASS;
	}
	return drop(LTP_C_MALFORMED, h);
}

#endif /* LTP_RUN_H */
