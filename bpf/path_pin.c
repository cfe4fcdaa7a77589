// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* path_pin.c: ECMP path pinning for the leaf-spine rig (tc, clsact egress, direct-action).
 *
 * Two programs, one build (they share the struct layouts below, which
 * dataplane/rig/pathpin.py mirrors with ctypes):
 *
 * link_count  on egress of every spine-facing veth (leaf uplinks, spine
 *             downlinks): adds skb->len to link_bytes[{link, 5-tuple}].
 *             The link is read from the frame's source MAC, which the rig
 *             assigns as 02:4c:<kind>:<a>:<b>:xx (kind 'L' = leaf a -> spine b,
 *             'S' = spine a -> leaf b), so one program and one map serve
 *             every router namespace (ifindexes repeat across namespaces).
 * path_pin    on egress of every host's veth: an IPv4 UDP packet whose
 *             {saddr, daddr, dport} is in path_pins leaves with the source
 *             port found by probing to hash onto the assigned spine; the UDP
 *             checksum is fixed with bpf_l4_csum_replace. Anything else passes
 *             untouched, so unpinned traffic keeps plain ECMP.
 */
/* The program's license string (bcc's footer puts it in the license
 * section): the dual licence of the SPDX line, GPL-compatible for the kernel. */
#define BPF_LICENSE Dual BSD/GPL

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/in.h>

#define LINK_KIND_LEAF_UP  0x4c   /* 'L' */
#define LINK_KIND_SPINE_DN 0x53   /* 'S' */

struct link_key {
	__u8 kind;        /* LINK_KIND_*: direction of the link */
	__u8 a;           /* leaf (kind L) or spine (kind S) index */
	__u8 b;           /* spine (kind L) or leaf (kind S) index */
	__u8 proto;       /* IP protocol; 0 for non-IPv4 frames */
	__u32 saddr;      /* network byte order */
	__u32 daddr;      /* network byte order */
	__u16 sport;      /* network byte order (0 unless UDP/TCP) */
	__u16 dport;      /* network byte order */
};

struct link_val {
	__u64 bytes;      /* skb->len: Ethernet frame bytes, a GSO skb counts whole */
	__u64 packets;    /* segments */
};

struct pin_key {
	__u32 saddr;      /* network byte order */
	__u32 daddr;      /* network byte order */
	__u16 dport;      /* network byte order */
	__u16 pad;
};

struct pin_val {
	__u16 sport;      /* network byte order: the source port to put on the wire */
	__u16 spine;      /* the spine it hashes to (for display only) */
	__u32 pad;
	__u64 packets;    /* packets rewritten (racy increment: a display figure) */
};

/* link_bytes: {link, 5-tuple} -> bytes, packets. Written by link_count;
 * read (and cleared) by Python (dataplane/rig/pathpin.py: link_counters,
 * clear_link_counters). */
BPF_TABLE("lru_hash", struct link_key, struct link_val, link_bytes, 65536);

/* path_pins: {saddr, daddr, dport} -> source port to use. Written by Python
 * (dataplane/rig/pathpin.py: set_pin, for control/pathplan.py: pin); read by
 * path_pin. */
BPF_HASH(path_pins, struct pin_key, struct pin_val, 4096);

int link_count(struct __sk_buff *skb)
{
	struct link_key k = {};
	struct link_val *v, zero = {};
	__u8 mac[6];
	__u64 segs = skb->gso_segs ? skb->gso_segs : 1;

	if (bpf_skb_load_bytes(skb, 6, mac, 6) < 0)
		return TC_ACT_OK;
	if (mac[0] != 0x02 || mac[1] != 0x4c)
		return TC_ACT_OK;
	k.kind = mac[2];
	k.a = mac[3];
	k.b = mac[4];
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) == 0) {
			k.proto = ip.protocol;
			k.saddr = ip.saddr;
			k.daddr = ip.daddr;
			if ((ip.protocol == IPPROTO_UDP || ip.protocol == IPPROTO_TCP) &&
			    ip.ihl == 5) {
				__u16 ports[2];

				if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip), ports, 4) == 0) {
					k.sport = ports[0];
					k.dport = ports[1];
				}
			}
		}
	}
	v = link_bytes.lookup(&k);
	if (!v) {
		link_bytes.update(&k, &zero);
		v = link_bytes.lookup(&k);
		if (!v)
			return TC_ACT_OK;
	}
	__sync_fetch_and_add(&v->bytes, skb->len);
	__sync_fetch_and_add(&v->packets, segs);
	return TC_ACT_OK;
}

#define UDP_OFF   (ETH_HLEN + sizeof(struct iphdr))
#define CSUM_OFF  (UDP_OFF + offsetof(struct udphdr, check))

int path_pin(struct __sk_buff *skb)
{
	struct iphdr ip;
	struct udphdr udp;
	struct pin_key k = {};
	struct pin_val *v;
	__u16 new_sport;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return TC_ACT_OK;
	if (ip.protocol != IPPROTO_UDP || ip.ihl != 5)
		return TC_ACT_OK;
	if (bpf_skb_load_bytes(skb, UDP_OFF, &udp, sizeof(udp)) < 0)
		return TC_ACT_OK;
	k.saddr = ip.saddr;
	k.daddr = ip.daddr;
	k.dport = udp.dest;
	v = path_pins.lookup(&k);
	if (!v || v->sport == udp.source)
		return TC_ACT_OK;
	new_sport = v->sport;
	/* The port is not in the pseudo header. BPF_F_MARK_MANGLED_0 leaves a
	 * checksum of 0 ("none") alone and keeps a computed 0 from meaning
	 * "none"; on a CHECKSUM_PARTIAL skb (a local socket's packet) the helper
	 * leaves the field alone, since the full sum is computed later. */
	bpf_l4_csum_replace(skb, CSUM_OFF, udp.source, new_sport,
			    BPF_F_MARK_MANGLED_0 | sizeof(new_sport));
	bpf_skb_store_bytes(skb, UDP_OFF + offsetof(struct udphdr, source), &new_sport,
			    sizeof(new_sport), 0);
	__sync_fetch_and_add(&v->packets, 1);
	return TC_ACT_OK;
}
