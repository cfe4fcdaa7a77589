// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* Rewriting a frame in place into the one it answers with: addresses and
 * ports swapped, lengths set, IP and UDP checksums computed. The receiver
 * turns DATA into its ACK (ltp_data.h), the ACK clock an ACK into DATA
 * (ltp_clock.h).
 */
#ifndef LTP_FRAME_H
#define LTP_FRAME_H

#include "ltp_wire.h"

static __always_inline __u16 ltp_csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

struct pseudo_hdr {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
};

/* The UDP checksum of an LTP frame: pseudo header, UDP and LTP headers,
 * plus the payload's sum (0 for an ACK, which has none). */
static __always_inline void udp_csum(struct iphdr *iph, struct udphdr *udp, __u32 payload_sum)
{
	struct pseudo_hdr ph = {
		.saddr = iph->saddr,
		.daddr = iph->daddr,
		.zero = 0,
		.proto = IPPROTO_UDP,
		.len = udp->len,
	};
	udp->check = 0;
	__u64 sum = (__u32)bpf_csum_diff(0, 0, (__be32 *)&ph, sizeof(ph), 0);
	sum = (__u32)bpf_csum_diff(0, 0, (__be32 *)udp, sizeof(*udp) + sizeof(struct ltp_hdr),
				   (__u32)sum);
	sum += payload_sum;
	sum = (sum & 0xffffffff) + (sum >> 32);
	__u16 c = ltp_csum_fold((__u32)sum);
	udp->check = c ? c : 0xffff;
}

/* Turn a frame around: swap MACs, addresses and ports, size it for an LTP
 * header plus `payload` bytes, and checksum the IP header (the UDP checksum
 * comes last, once the LTP header is written: udp_csum). */
static __always_inline void turn_around(struct ethhdr *eth, struct iphdr *iph,
					struct udphdr *udp, __u32 payload)
{
	__u8 mac[ETH_ALEN];
	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);

	__be32 a = iph->saddr;
	iph->saddr = iph->daddr;
	iph->daddr = a;
	iph->tot_len = bpf_htons(sizeof(*iph) + sizeof(*udp) + sizeof(struct ltp_hdr) + payload);
	iph->ttl = 64;
	iph->check = 0;
	iph->check = ltp_csum_fold(bpf_csum_diff(0, 0, (__be32 *)iph, sizeof(*iph), 0));

	__be16 p = udp->source;
	udp->source = udp->dest;
	udp->dest = p;
	udp->len = bpf_htons(sizeof(*udp) + sizeof(struct ltp_hdr) + payload);
}

#endif /* LTP_FRAME_H */
