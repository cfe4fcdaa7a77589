/* xdp_pass: passes every packet. Attached to the peer of a veth whose other
 * end runs ltp_xdp in native mode, because veth delivers XDP_TX frames only
 * to a peer that has an XDP program of its own. */
#include <uapi/linux/bpf.h>

int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}
