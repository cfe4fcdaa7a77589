// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* xdp_pass: passes every packet. Attached to the peer of a veth whose other
 * end runs ltp_xdp in native mode, because veth delivers XDP_TX frames only
 * to a peer that has an XDP program of its own. */
/* The program's license string (bcc's footer puts it in the license
 * section): the dual licence of the SPDX line, GPL-compatible for the kernel. */
#define BPF_LICENSE Dual BSD/GPL

#include <uapi/linux/bpf.h>

int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}
