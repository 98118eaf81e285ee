/* SpINA: parser, checksum controls and deparser (v1model).
 *
 * Ethernet -> IPv4 (ihl 5 only) -> UDP -> INA when the UDP destination port is INA_UDP_PORT.
 * The INA header is followed by min(nlanes, NLANES) lane positions and, when block_size is the
 * P4 BLOCK_SIZE, one block per set `present` bit, of 32-, 16- or 8-bit values by the flags. A packet whose sizes the P4 cannot hold
 * stops parsing early: it can never be admitted (the controller only admits P4 sizes), and
 * its malformedness is decided arithmetically by InaCheck, exactly as wire.check_header does.
 * A truncated packet leaves parser_error set (v1model continues into ingress), which InaCheck
 * counts as malformed.
 */
#ifndef SPINA_PARSER_P4
#define SPINA_PARSER_P4

parser SpinaParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t std) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.protocol) {
            (4w5, IP_PROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            INA_UDP_PORT: parse_ina;
            default: accept;
        }
    }

    state parse_ina {
        pkt.extract(hdr.ina);
        transition select(hdr.ina.nlanes) {
            0: accept;
            default: parse_lane_next_0;
        }
    }

    // parse_lane_next_L: extract lane L's position; stop after nlanes of them.
#define SPINA_LANE_NEXT_STATE(L, N)                         \
    state parse_lane_next_##L {                             \
        pkt.extract(hdr.lane_next[L]);                      \
        transition select(hdr.ina.nlanes) {                 \
            N: parse_blocks;                                \
            default: parse_lane_next_##N;                   \
        }                                                   \
    }
    FOR_EACH_LANE_PAIR(SPINA_LANE_NEXT_STATE)

    // More lanes than the P4 holds: never admitted; leave the rest as payload.
    state parse_lane_next_4 {
        transition accept;
    }

    // The rows' width by the flags (both width bits: malformed, InaCheck's).
    state parse_blocks {
        transition select(hdr.ina.block_size, hdr.ina.flags[7:6]) {
            (BLOCK_SIZE, 2w0): parse_block_0;
            (BLOCK_SIZE, 2w1): parse_block16_0;
            (BLOCK_SIZE, 2w2): parse_block8_0;
            default: accept;
        }
    }

    // parse_block_L: lane L carries a block iff its present bit is set.
#define SPINA_BLOCK_STATE(L, N)                             \
    state parse_block_##L {                                 \
        transition select(hdr.ina.present[L:L]) {           \
            1: extract_block_##L;                           \
            default: parse_block_##N;                       \
        }                                                   \
    }                                                       \
    state extract_block_##L {                               \
        pkt.extract(hdr.block[L]);                          \
        transition parse_block_##N;                         \
    }
    FOR_EACH_LANE_PAIR(SPINA_BLOCK_STATE)

    state parse_block_4 {
        transition accept;
    }

#define SPINA_NARROW_BLOCK_STATE(W, L, N)                   \
    state parse_block##W##_##L {                            \
        transition select(hdr.ina.present[L:L]) {           \
            1: extract_block##W##_##L;                      \
            default: parse_block##W##_##N;                  \
        }                                                   \
    }                                                       \
    state extract_block##W##_##L {                          \
        pkt.extract(hdr.block##W[L]);                       \
        transition parse_block##W##_##N;                    \
    }
#define SPINA_BLOCK16_STATE(L, N) SPINA_NARROW_BLOCK_STATE(16, L, N)
#define SPINA_BLOCK8_STATE(L, N) SPINA_NARROW_BLOCK_STATE(8, L, N)
    FOR_EACH_LANE_PAIR(SPINA_BLOCK16_STATE)
    FOR_EACH_LANE_PAIR(SPINA_BLOCK8_STATE)

    state parse_block16_4 {
        transition accept;
    }

    state parse_block8_4 {
        transition accept;
    }
}

// The software switch does not verify IPv4 checksums either: nothing to do.
control SpinaVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

// Recompute the IPv4 checksum only where the switch changed the header, so that a bridged
// packet leaves byte for byte as it came (also with a wrong checksum).
control SpinaComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(meta.ipv4_update && hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

// Valid headers in declaration order; stack elements in index order (lane order).
control SpinaDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr);
    }
}

#endif
