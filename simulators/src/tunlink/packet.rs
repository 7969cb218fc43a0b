//! IPv4 packets on the emulated link: which way a packet goes, and the
//! hairpin rewrite that turns what one end sent into what the other end
//! expects to receive.
//!
//! No I/O here. Both ends live on one host, at the `local` address. A
//! client reaches the server by dialling the fake `remote` address; the
//! server sees the client at the fake `mirror` address:
//!
//! ```text
//! sent by the client  local:sp  -> remote:P   re-injected as  mirror:sp -> local:P
//! sent by the server  local:P   -> mirror:sp  re-injected as  remote:P  -> local:sp
//! ```
//!
//! Ports stay; only addresses change, so every TCP or UDP flow maps one to
//! one. The IPv4 header checksum is recomputed; the TCP or UDP checksum,
//! whose pseudo-header covers the addresses, is adjusted for the changed
//! address words (RFC 1624, as a NAT does). Adjusting rather than summing
//! the payload again keeps a packet with a wrong checksum wrong, costs the
//! same for any size, and works on the first fragment of a fragmented
//! datagram, which does not hold the whole payload. ICMP checksums do not
//! cover addresses, so pings pass; the packet quoted inside an ICMP error
//! is not rewritten.
//!
//! Packets come from the kernel but are still input: anything short,
//! inconsistent or not IPv4 is refused with a [`Refusal`], never a panic.

use std::net::Ipv4Addr;

use crate::proxy::link::Direction;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
/// Offset of the checksum inside a TCP and a UDP header.
const TCP_CHECKSUM: usize = 16;
const UDP_CHECKSUM: usize = 6;

/// The three addresses of the hairpin; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hairpin {
    /// The host's own address on the TUN device: both ends bind here.
    pub local: Ipv4Addr,
    /// What clients dial to reach a server on `local`.
    pub remote: Ipv4Addr,
    /// Where a server on `local` sees its clients come from.
    pub mirror: Ipv4Addr,
}

/// Why a packet read from the device was not carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not IPv4 (e.g. IPv6 router solicitations the kernel sends on any
    /// new interface).
    NotIpv4,
    /// Too short for its headers, or lengths that contradict each other.
    Malformed,
    /// IPv4 between addresses the hairpin does not map.
    Foreign,
}

/// A packet rewritten for the other end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rewritten {
    /// Which way through the link: towards the server (`ToUpstream`) or
    /// back to the client (`ToClient`).
    pub direction: Direction,
    /// Bytes of the packet (its IPv4 total length); anything after that in
    /// the buffer is not part of it.
    pub len: usize,
}

impl Hairpin {
    /// Rewrites `packet` in place for the other end; see the module docs.
    /// On a refusal the packet may be left unchanged or half checked, never
    /// half rewritten.
    pub fn rewrite(&self, packet: &mut [u8]) -> Result<Rewritten, Refusal> {
        let first = *packet.first().ok_or(Refusal::Malformed)?;
        if first >> 4 != 4 {
            return Err(Refusal::NotIpv4);
        }
        let header_len = usize::from(first & 0x0f) * 4;
        if header_len < 20 || packet.len() < header_len {
            return Err(Refusal::Malformed);
        }
        let len = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
        if len < header_len || len > packet.len() {
            return Err(Refusal::Malformed);
        }
        let packet = &mut packet[..len];
        let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
        let dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
        let (direction, new_src, new_dst) = if src == self.local && dst == self.remote {
            (Direction::ToUpstream, self.mirror, self.local)
        } else if src == self.local && dst == self.mirror {
            (Direction::ToClient, self.remote, self.local)
        } else {
            return Err(Refusal::Foreign);
        };

        // Where the transport checksum sits, if this packet carries it:
        // only the first fragment (offset 0) holds the transport header.
        let fragment_offset = u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff;
        let transport = if fragment_offset == 0 {
            match packet[9] {
                PROTO_TCP => Some((header_len + TCP_CHECKSUM, false)),
                PROTO_UDP => Some((header_len + UDP_CHECKSUM, true)),
                _ => None,
            }
        } else {
            None
        };
        if let Some((at, _)) = transport
            && len < at + 2
        {
            return Err(Refusal::Malformed);
        }

        // Checked; now change it.
        if let Some((at, udp)) = transport {
            let old = u16::from_be_bytes([packet[at], packet[at + 1]]);
            // A UDP checksum of 0 means "none"; there is nothing to adjust.
            if !(udp && old == 0) {
                let mut sum = u32::from(!old);
                for word in words(src).into_iter().chain(words(dst)) {
                    sum += u32::from(!word);
                }
                for word in words(new_src).into_iter().chain(words(new_dst)) {
                    sum += u32::from(word);
                }
                let mut new = !fold(sum);
                // Over UDP 0 would say "no checksum": send its other form.
                if udp && new == 0 {
                    new = 0xffff;
                }
                packet[at..at + 2].copy_from_slice(&new.to_be_bytes());
            }
        }
        packet[12..16].copy_from_slice(&new_src.octets());
        packet[16..20].copy_from_slice(&new_dst.octets());
        packet[10..12].copy_from_slice(&[0, 0]);
        let header_sum = !fold(sum_words(&packet[..header_len]));
        packet[10..12].copy_from_slice(&header_sum.to_be_bytes());
        Ok(Rewritten { direction, len })
    }
}

/// An address as the two 16-bit words a checksum adds.
fn words(addr: Ipv4Addr) -> [u16; 2] {
    let o = addr.octets();
    [u16::from_be_bytes([o[0], o[1]]), u16::from_be_bytes([o[2], o[3]])]
}

/// The 32-bit sum of `bytes` as big-endian 16-bit words (an odd last byte
/// padded with zero), not yet folded. A u32 cannot overflow below 128 KiB,
/// twice the largest IPv4 packet.
fn sum_words(bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(2);
    let mut sum: u32 = chunks.by_ref().map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

/// Folds the carries of a ones' complement sum into 16 bits.
fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop leaves at most 0xffff.
    u16::try_from(sum).unwrap_or(u16::MAX)
}

/// Whether an IPv4 packet's header checksum and its TCP or UDP checksum
/// (meaningless for other protocols and for fragments) verify, summed from
/// scratch. For tests, which
/// check the incremental rewrite against it.
#[cfg(test)]
fn checksums_verify(packet: &[u8]) -> (bool, bool) {
    let header_len = usize::from(packet[0] & 0x0f) * 4;
    let header_ok = fold(sum_words(&packet[..header_len])) == 0xffff;
    let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    let segment = &packet[header_len..total];
    let mut pseudo = sum_words(&packet[12..20]);
    pseudo += u32::from(packet[9]);
    pseudo += u32::try_from(segment.len()).unwrap_or(0);
    let transport_ok = fold(pseudo + sum_words(segment)) == 0xffff;
    (header_ok, transport_ok)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const HAIRPIN: Hairpin = Hairpin {
        local: Ipv4Addr::new(10, 77, 0, 1),
        remote: Ipv4Addr::new(10, 77, 1, 1),
        mirror: Ipv4Addr::new(10, 77, 1, 2),
    };

    /// A valid IPv4 packet of `protocol` with a transport header of
    /// `transport_len` bytes (ports 40000 -> 443) then `payload`, with
    /// correct checksums computed from scratch.
    fn packet(protocol: u8, src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
        let transport_len = match protocol {
            PROTO_TCP => 20,
            PROTO_UDP => 8,
            _ => 0,
        };
        let total = 20 + transport_len + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&u16::try_from(total).unwrap().to_be_bytes());
        p[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        p[6] = 0x40; // don't fragment
        p[8] = 64;
        p[9] = protocol;
        p[12..16].copy_from_slice(&src.octets());
        p[16..20].copy_from_slice(&dst.octets());
        let header = !fold(sum_words(&p[..20]));
        p[10..12].copy_from_slice(&header.to_be_bytes());
        if transport_len > 0 {
            p[20..22].copy_from_slice(&40000u16.to_be_bytes());
            p[22..24].copy_from_slice(&443u16.to_be_bytes());
        }
        if protocol == PROTO_TCP {
            p[32] = 0x50; // data offset: 5 words
            p[33] = 0x18; // PSH, ACK
        }
        if protocol == PROTO_UDP {
            let udp_len = u16::try_from(8 + payload.len()).unwrap();
            p[24..26].copy_from_slice(&udp_len.to_be_bytes());
        }
        p[20 + transport_len..].copy_from_slice(payload);
        if transport_len > 0 {
            let mut pseudo = sum_words(&p[12..20]) + u32::from(protocol);
            pseudo += u32::try_from(total - 20).unwrap();
            let sum = !fold(pseudo + sum_words(&p[20..]));
            let at = 20 + if protocol == PROTO_TCP { TCP_CHECKSUM } else { UDP_CHECKSUM };
            p[at..at + 2].copy_from_slice(&sum.to_be_bytes());
        }
        let (header_ok, transport_ok) = checksums_verify(&p);
        assert!(header_ok && (transport_ok || transport_len == 0), "the test packet is valid");
        p
    }

    fn addrs(p: &[u8]) -> (Ipv4Addr, Ipv4Addr) {
        (Ipv4Addr::new(p[12], p[13], p[14], p[15]), Ipv4Addr::new(p[16], p[17], p[18], p[19]))
    }

    #[test]
    fn sums_match_a_known_header() {
        // The IPv4 header of Wikipedia's checksum example: checksum 0xb861.
        let header = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(fold(sum_words(&header)), 0xffff);
        let mut zeroed = header;
        zeroed[10..12].copy_from_slice(&[0, 0]);
        assert_eq!(!fold(sum_words(&zeroed)), 0xb861);
    }

    #[test]
    fn a_client_packet_goes_to_the_server_from_the_mirror_and_back() {
        for protocol in [PROTO_TCP, PROTO_UDP] {
            let mut out = packet(protocol, HAIRPIN.local, HAIRPIN.remote, b"hello, server");
            let done = HAIRPIN.rewrite(&mut out).unwrap();
            assert_eq!(done, Rewritten { direction: Direction::ToUpstream, len: out.len() });
            assert_eq!(addrs(&out), (HAIRPIN.mirror, HAIRPIN.local));
            assert_eq!(checksums_verify(&out), (true, true), "protocol {protocol}");

            // The server answers the mirror; the client hears the remote.
            let mut back = packet(protocol, HAIRPIN.local, HAIRPIN.mirror, b"hello, client!");
            let done = HAIRPIN.rewrite(&mut back).unwrap();
            assert_eq!(done.direction, Direction::ToClient);
            assert_eq!(addrs(&back), (HAIRPIN.remote, HAIRPIN.local));
            assert_eq!(checksums_verify(&back), (true, true), "protocol {protocol}");
            assert_eq!(
                &back[20..24],
                &packet(protocol, HAIRPIN.local, HAIRPIN.mirror, b"")[20..24]
            );
        }
    }

    #[test]
    fn ports_and_payload_are_left_alone() {
        let original = packet(PROTO_TCP, HAIRPIN.local, HAIRPIN.remote, b"payload");
        let mut out = original.clone();
        HAIRPIN.rewrite(&mut out).unwrap();
        assert_eq!(out[20..36], original[20..36], "ports, sequence and ack numbers, flags");
        assert_eq!(out[40..], original[40..]);
    }

    #[test]
    fn a_udp_packet_without_checksum_keeps_none_and_icmp_only_changes_addresses() {
        let mut udp = packet(PROTO_UDP, HAIRPIN.local, HAIRPIN.remote, b"x");
        udp[26..28].copy_from_slice(&[0, 0]);
        HAIRPIN.rewrite(&mut udp).unwrap();
        assert_eq!(udp[26..28], [0, 0]);
        assert!(checksums_verify(&udp).0);

        let mut ping = packet(1, HAIRPIN.local, HAIRPIN.remote, &[8, 0, 0xf7, 0xff, 0, 0, 0, 0]);
        let before = ping[20..].to_vec();
        HAIRPIN.rewrite(&mut ping).unwrap();
        assert_eq!(ping[20..], before);
        assert!(checksums_verify(&ping).0);
    }

    #[test]
    fn a_wrong_transport_checksum_stays_wrong() {
        let mut out = packet(PROTO_TCP, HAIRPIN.local, HAIRPIN.remote, b"data");
        out[36] ^= 0x01;
        HAIRPIN.rewrite(&mut out).unwrap();
        assert_eq!(checksums_verify(&out), (true, false));
    }

    #[test]
    fn bytes_past_the_total_length_are_not_part_of_the_packet() {
        let mut out = packet(PROTO_UDP, HAIRPIN.local, HAIRPIN.remote, b"abc");
        let len = out.len();
        out.extend_from_slice(&[0xaa; 5]);
        assert_eq!(HAIRPIN.rewrite(&mut out).unwrap().len, len);
        assert_eq!(checksums_verify(&out[..len]), (true, true));
    }

    #[test]
    fn refusals() {
        let good = packet(PROTO_TCP, HAIRPIN.local, HAIRPIN.remote, b"data");
        let cases: Vec<(Vec<u8>, Refusal)> = vec![
            (vec![], Refusal::Malformed),
            (vec![0x60; 40], Refusal::NotIpv4),
            (good[..19].to_vec(), Refusal::Malformed),
            (good[..30].to_vec(), Refusal::Malformed), // total length beyond the buffer
            (
                {
                    let mut p = good.clone();
                    p[0] = 0x44; // header length 16
                    p
                },
                Refusal::Malformed,
            ),
            (
                {
                    let mut p = good.clone();
                    p[0] = 0x4f; // header length 60, more than the 44 bytes there are
                    p
                },
                Refusal::Malformed,
            ),
            (
                {
                    let mut p = good.clone();
                    p[2..4].copy_from_slice(&30u16.to_be_bytes()); // TCP header cut short
                    p
                },
                Refusal::Malformed,
            ),
            (packet(PROTO_TCP, HAIRPIN.remote, HAIRPIN.local, b""), Refusal::Foreign),
            (packet(PROTO_UDP, Ipv4Addr::new(10, 77, 0, 9), HAIRPIN.remote, b""), Refusal::Foreign),
        ];
        for (mut p, refusal) in cases {
            let before = p.clone();
            assert_eq!(HAIRPIN.rewrite(&mut p), Err(refusal), "{before:02x?}");
            assert_eq!(p, before, "a refused packet is left unchanged");
        }
    }

    #[test]
    fn a_later_fragment_only_gets_new_addresses() {
        let mut frag = packet(PROTO_UDP, HAIRPIN.local, HAIRPIN.remote, &[7; 40]);
        frag[6..8].copy_from_slice(&0x0010u16.to_be_bytes()); // offset 128 B
        let header = !fold(sum_words(&{
            let mut h = frag[..20].to_vec();
            h[10..12].copy_from_slice(&[0, 0]);
            h
        }));
        frag[10..12].copy_from_slice(&header.to_be_bytes());
        let body = frag[20..].to_vec();
        HAIRPIN.rewrite(&mut frag).unwrap();
        assert_eq!(frag[20..], body);
        assert!(checksums_verify(&frag).0);
    }

    proptest! {
        #[test]
        fn any_bytes_are_refused_or_rewritten_without_panic(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..128),
        ) {
            let _ = HAIRPIN.rewrite(&mut bytes);
        }

        #[test]
        fn rewritten_checksums_verify_for_any_payload(
            payload in proptest::collection::vec(any::<u8>(), 0..1500),
            udp in any::<bool>(),
            back in any::<bool>(),
        ) {
            let protocol = if udp { PROTO_UDP } else { PROTO_TCP };
            let dst = if back { HAIRPIN.mirror } else { HAIRPIN.remote };
            let mut p = packet(protocol, HAIRPIN.local, dst, &payload);
            HAIRPIN.rewrite(&mut p).unwrap();
            prop_assert_eq!(checksums_verify(&p), (true, true));
        }
    }
}
