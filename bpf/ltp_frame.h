// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* Rewriting a frame in place into the one it answers with: addresses and
 * ports swapped, lengths set, IP and UDP checksums computed. The receiver
 * turns DATA into its ACK (ltp_data.h), the ACK clock an ACK into DATA
 * (ltp_clock.h).
 */
#ifndef LTP_FRAME_H
#define LTP_FRAME_H

#include "ltp_wire.h"
#include "ltp_maps.h"
#include "ltp_util.h"

static __always_inline __u16 ltp_csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* The ones' complement sum of the n 16-bit words at p, as they lie in
 * memory (n a constant: the loop is unrolled, no helper is called). The
 * words of a folded sum keep their byte order, so the checksum it gives is
 * stored as it is. */
static __always_inline __u32 csum_words(const __u16 *p, int n)
{
	__u32 sum = 0;
#pragma unroll
	for (int i = 0; i < n; i++)
		sum += p[i];
	return sum;
}

/* What a stored checksum gains when one 16-bit word changes from `from` to
 * `to` (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')); words as they lie in
 * memory. csum_amend applies the gains of several words at once. */
static __always_inline __u32 csum_change(__u16 from, __u16 to)
{
	return (__u16)~from + (__u32)to;
}

static __always_inline __u32 csum_change32(__u32 from, __u32 to)
{
	return csum_change(from, to) + csum_change(from >> 16, to >> 16);
}

/* The ones' complement sum of a 64-bit value's four 16-bit words as it
 * lies in memory (the lanes are the same words in either byte order). */
static __always_inline __u32 csum_u64(__u64 v)
{
	return (v & 0xffff) + ((v >> 16) & 0xffff) + ((v >> 32) & 0xffff) + (v >> 48);
}

/* The checksum `check` corrected by `delta` (a sum of csum_change); a UDP
 * sum that comes to 0 is sent as 0xffff (0 says "none"). */
static __always_inline __u16 csum_amend(__u16 check, __u32 delta)
{
	__u16 c = ltp_csum_fold((__u16)~check + delta);
	return c ? c : 0xffff;
}

/* The UDP checksum of an LTP frame: pseudo header (addresses, protocol,
 * UDP length), UDP and LTP headers, plus the payload's sum (0 for an ACK,
 * which has none). */
static __always_inline void udp_csum(struct iphdr *iph, struct udphdr *udp, __u32 payload_sum)
{
	udp->check = 0;
	__u32 sum = csum_words((__u16 *)&iph->saddr, 4) + bpf_htons(IPPROTO_UDP) + udp->len;
	sum += csum_words((__u16 *)udp, (sizeof(*udp) + sizeof(struct ltp_hdr)) / 2);
	sum += payload_sum;
	__u16 c = ltp_csum_fold(sum);
	udp->check = c ? c : 0xffff;
}

/* Whether the UDP checksum of a DATA frame verifies, its payload read from
 * the n bytes (a multiple of 4) copied into chunk c: pseudo header, UDP
 * header with its checksum, LTP header, then the payload through
 * bpf_csum_diff in pieces of at most 512 bytes (the helper's limit). A
 * frame without a checksum (0) does not verify. */
static __always_inline int udp_csum_ok(struct iphdr *iph, struct udphdr *udp,
				       struct ltp_chunk *c, __u64 n)
{
	if (!udp->check)
		return 0;
	__u64 sum = csum_words((__u16 *)&iph->saddr, 4) + bpf_htons(IPPROTO_UDP) + udp->len;
	sum += csum_words((__u16 *)udp, (sizeof(*udp) + sizeof(struct ltp_hdr)) / 2);
#pragma unroll
	for (int i = 0; i < (LTP_CHUNK_BYTES + 511) / 512; i++) {
		__u64 off = i * 512, room = LTP_CHUNK_BYTES - i * 512;
		if (n <= off)
			break;
		__u64 len = n - off;
		barrier_var(len);
		if (len > 512)
			len = 512;
		barrier_var(len);
		if (len > room || len > 512)
			return 0;
		__s64 s = bpf_csum_diff(NULL, 0, (__be32 *)(c->b + off), len, 0);
		if (s < 0)
			return 0;
		sum += (__u32)s;
	}
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	return ltp_csum_fold((__u32)sum) == 0;
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
	iph->check = ltp_csum_fold(csum_words((__u16 *)iph, sizeof(*iph) / 2));

	__be16 p = udp->source;
	udp->source = udp->dest;
	udp->dest = p;
	udp->len = bpf_htons(sizeof(*udp) + sizeof(struct ltp_hdr) + payload);
}

#endif /* LTP_FRAME_H */
