// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* ltp_gen: DATA traffic for `ltp bench xdp`'s live arms
 * (control/bench/xdp_live.py). Run by BPF_PROG_TEST_RUN in live-frames
 * mode on one end of a veth pair, it makes each frame the next DATA of a
 * round: the headers written afresh from ltp_gen (the page may come back
 * holding what the far end's program made of it, an ACK: its length too),
 * the round and chunk set,
 * and XDP_TX, which in this mode sends it out of the end it runs on: the
 * far end's program (ltp_floor or ltp_xdp, attached in native mode)
 * receives the frames in its NAPI loop, a batch at a time. Never attached.
 */
/* The program's license string (bcc's footer puts it in the license
 * section): the dual licence of the SPDX line, GPL-compatible for the kernel. */
#define BPF_LICENSE Dual BSD/GPL

#include <uapi/linux/bpf.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include "ltp_parse.h"

struct ltp_gen_state {
	__u32 round;           /* bench: the round the frames carry */
	__u32 nchunks;         /* bench: chunks in the round (the chunk wraps at it) */
	__u32 next;            /* the next chunk (this program counts it up; one CPU runs it) */
	__u32 len;             /* bench: the frame's length (the far end may have cut it) */
	__u64 hdr[11];         /* bench: eth, ip, udp and LTP headers of worker 1's DATA (PAY_OFF
	                          bytes, 82: a literal size, which bcc's table description needs) */
};

/* ltp_gen: the bench writes round, nchunks and hdr; this program counts `next` */
BPF_ARRAY(ltp_gen, struct ltp_gen_state, 1);

int ltp_gen_xdp(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct ltp_gen_state *g = ltp_gen.lookup(&zero);
	if (!g || !g->nchunks || PAY_OFF > sizeof(g->hdr))
		return XDP_ABORTED;
	int grow = (int)g->len - (int)(ctx->data_end - ctx->data);
	if (grow && bpf_xdp_adjust_tail(ctx, grow))
		return XDP_ABORTED;
	if (bpf_xdp_store_bytes(ctx, 0, g->hdr, PAY_OFF))
		return XDP_ABORTED;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ltp_hdr *h = data + LTP_OFF;
	if ((void *)(h + 1) > data_end)
		return XDP_ABORTED;
	__u32 c = g->next;
	g->next = c + 1 < g->nchunks ? c + 1 : 0;
	h->round = bpf_htonl(g->round);
	h->chunk = bpf_htonl(c);
	return XDP_TX;
}
