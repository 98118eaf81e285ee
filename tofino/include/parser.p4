/* SpINA on Tofino 1: parsers, deparsers and the IPv4 checksum (TNA).
 *
 * Ingress: Ethernet -> IPv4 (ihl 5 only) -> UDP -> INA when the UDP destination port is
 * INA_UDP_PORT; then lane 0's position and block (block_e, block_i) only at the sizes this
 * program aggregates (nlanes == NLANES, block_size == BLOCK_SIZE; the block when present bit 0
 * is set). Other sizes stop after the INA header and are malformed here (InaCheck). A frame
 * that ends inside an extracted header sets parser_err, which InaCheck counts as malformed.
 * On the recirculation port a reply comes back for its second or third pass: the harvest
 * header, the egress part of the block when it has one (block_e, or block_w in the third
 * pass), then the reply as the first pass wrote it (its UDP ports are the worker's by then).
 * Egress (160 bytes deep at most) parses the bridged header, then either the egress part of
 * the block (a pass through the recirculation port: egress adds or reads those pairs, and the
 * rest is payload) or the headers up to INA (a packet that leaves: the rewrite, the result
 * counter and the congestion drop read nothing further).
 */
#ifndef SPINA_TNA_PARSER_P4
#define SPINA_TNA_PARSER_P4

parser SpinaIngressParser(packet_in pkt, out tna_headers_t hdr, out tna_ingress_md_t meta,
                          out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);  // Tofino 1 port metadata: unused
        transition select(ig_intr_md.ingress_port) {
            RECIRC_PORT &&& RECIRC_PORT_MASK: parse_harvest;
            default: parse_ethernet;
        }
    }

    // Only this program's egress sends packets to the recirculation port.
    state parse_harvest {
        pkt.extract(hdr.harvest);
        transition select(hdr.harvest.last, hdr.harvest.block) {
            (0, 1): parse_front_block;
            (1, 1): parse_front_block_last;
            default: parse_reply;
        }
    }

    state parse_front_block {
        pkt.extract(hdr.block_e);
        transition parse_reply;
    }

    // The last pass puts the egress part back at its wire position.
    state parse_front_block_last {
        pkt.extract(hdr.block_w);
        transition parse_reply;
    }

    state parse_reply {
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.ina);
        pkt.extract(hdr.lane_next);
        transition select(hdr.harvest.block) {
            1: parse_block_i;
            default: accept;
        }
    }

    state parse_ethernet {
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
        transition select(hdr.ina.nlanes, hdr.ina.block_size) {
            (NLANES, BLOCK_SIZE): parse_lane_next;
            default: accept;
        }
    }

    state parse_lane_next {
        pkt.extract(hdr.lane_next);
        transition select(hdr.ina.present[0:0]) {
            1: parse_block;
            default: accept;
        }
    }

    state parse_block {
        pkt.extract(hdr.block_e);
        transition parse_block_i;
    }

    state parse_block_i {
        pkt.extract(hdr.block_i);
        transition accept;
    }
}

// The bridged header first, block_e behind it (towards the recirculation port), then the
// packet's headers in wire order (invalid ones are skipped).
control SpinaIngressDeparser(packet_out pkt, inout tna_headers_t hdr, in tna_ingress_md_t meta,
                             in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr.bridge);
        pkt.emit(hdr.block_e);
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.ina);
        pkt.emit(hdr.lane_next);
        pkt.emit(hdr.block_w);
        pkt.emit(hdr.block_i);
    }
}

parser SpinaEgressParser(packet_in pkt, out tna_headers_t hdr, out tna_egress_md_t meta,
                         out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridge);
        transition select(hdr.bridge.block_front, hdr.bridge.zero_front, hdr.bridge.to_harvest,
                          hdr.bridge.hold_drop) {
            (1, _, _, _): parse_front_block;
            (_, 1, _, _): zero_front_block;
            (_, _, 1, _): accept;  // a reply without a block on its way round: nothing to parse
            (_, _, _, 1): accept;
            default: parse_ethernet;
        }
    }

    // A READ of the egress pairs' low halves adds zeros (include/pairs.p4); ingress sent none.
#define SPINA_ZERO_ELEM(E) hdr.block_e.e##E = 0;
    state zero_front_block {
        hdr.block_e.setValid();
        FOR_EACH_EGRESS_ELEM(SPINA_ZERO_ELEM)
        transition accept;
    }

    state parse_front_block {
        pkt.extract(hdr.block_e);
        transition accept;
    }

    state parse_ethernet {
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

    // A reply this switch wrote goes to the worker's own UDP port: the bridged flag says INA.
    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.bridge.ina_emitted, hdr.udp.dst_port) {
            (1, _): parse_ina;
            (_, INA_UDP_PORT): parse_ina;
            default: accept;
        }
    }

    state parse_ina {
        pkt.extract(hdr.ina);
        transition accept;
    }
}

// The IPv4 checksum only where the switch changed the header, so that a bridged packet leaves
// byte for byte as it came (also with a wrong checksum). The bridged header is not emitted;
// the harvest header and block_e only towards the recirculation port.
control SpinaEgressDeparser(packet_out pkt, inout tna_headers_t hdr, in tna_egress_md_t meta,
                            in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        if (hdr.bridge.ipv4_update == 1) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
                hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
                hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr});
        }
        pkt.emit(hdr.harvest);
        pkt.emit(hdr.block_e);
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.ina);
    }
}

#endif
