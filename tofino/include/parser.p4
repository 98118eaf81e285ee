/* SpINA on Tofino 1: parsers, deparsers and the IPv4 checksum (TNA).
 *
 * Ingress: Ethernet -> IPv4 (ihl 5 only) -> UDP -> INA when the UDP destination port is
 * INA_UDP_PORT; then lane 0's position and block (block_e, block_i) only at the sizes this
 * program aggregates (nlanes == NLANES, block_size == BLOCK_SIZE; the block when present bit 0
 * is set). Other sizes stop after the INA header and are malformed here (InaCheck). A frame
 * that ends inside an extracted header sets parser_err, which InaCheck counts as malformed.
 * On the recirculation port a reply comes back for its harvest pass: the harvest header,
 * then the reply as the first pass wrote it (its UDP ports are the worker's by then; its
 * block follows when its present bit 0 is set).
 * Egress parses up to the INA header, then what ingress says follows it (lane_next, and
 * block_e when the packet carries the block: egress adds those elements); block_i stays
 * payload.
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
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.ina);
        pkt.extract(hdr.lane_next);
        transition select(hdr.ina.present[0:0]) {
            1: parse_block;
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
        pkt.extract(hdr.block_i);
        transition accept;
    }
}

// The bridged header first, then the packet's headers in order (invalid ones are skipped).
control SpinaIngressDeparser(packet_out pkt, inout tna_headers_t hdr, in tna_ingress_md_t meta,
                             in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr);
    }
}

parser SpinaEgressParser(packet_in pkt, out tna_headers_t hdr, out tna_egress_md_t meta,
                         out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridge);
        transition parse_ethernet;
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
        transition select(hdr.bridge.lane_out, hdr.bridge.block_out) {
            (1, 1): parse_lane_block;
            (1, 0): parse_lane_next;
            default: accept;
        }
    }

    state parse_lane_next {
        pkt.extract(hdr.lane_next);
        transition accept;
    }

    state parse_lane_block {
        pkt.extract(hdr.lane_next);
        pkt.extract(hdr.block_e);
        transition accept;
    }
}

// The IPv4 checksum only where the switch changed the header, so that a bridged packet leaves
// byte for byte as it came (also with a wrong checksum). The bridged header is not emitted;
// the harvest header only towards the recirculation port.
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
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.ina);
        pkt.emit(hdr.lane_next);
        pkt.emit(hdr.block_e);
    }
}

#endif
