/* SpINA: is this a well-formed INA contribution or all-gather packet? The same test as
 * wire.check_header plus "hosts send contributions and all-gather packets only" (softswitch
 * Pipeline.ina_check), decided from header fields,
 * the UDP length and the frame's real length, so that packets whose sizes the P4 cannot parse
 * are judged as the software switch judges them: a frame shorter than its UDP length is
 * malformed even where the parser stopped early and saw no parser_error (softswitch
 * Dataplane._terminate); bytes after the UDP length are an Ethernet trailer, not payload.
 * Such packets carry no job id one can trust: they are counted per ingress port.
 * At a leaf, a RESULT or STATUS for a slot with a leaf_upstream entry (meta.fab.from_spine,
 * v1model/fabric.p4) is a spine's answer, judged like any packet otherwise
 * (softswitch/fabric.py: wire.header_error).
 */
#ifndef SPINA_INA_CHECK_P4
#define SPINA_INA_CHECK_P4

control InaCheck(in headers_t hdr, in metadata_t meta, in standard_metadata_t std,
                 out bool malformed) {
    @name(".port_malformed") counter(MAX_PORTS, CounterType.packets) port_malformed;

    apply {
        // popcount(present), branch-free (no loops in P4): pairwise sums of bits.
        bit<64> x = hdr.ina.present;
        x = x - ((x >> 1) & 0x5555555555555555);
        x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333);
        x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0f;
        bit<32> npresent = (bit<32>)((x * 0x0101010101010101) >> 56);
        // wire.packet_len + the UDP header: the only length a switch can trust.
        // Bytes per value by the lane width (wire.row_bytes): 4, 2 (LANES16) or 1 (LANES8).
        bit<8> width = hdr.ina.flags & FLAGS_LANE_WIDTH;
        bit<32> item = width == FLAG_LANES16 ? 32w2 : (width == FLAG_LANES8 ? 32w1 : 32w4);
        bit<32> want = (bit<32>)UDP_HDR_BYTES + (bit<32>)INA_HDR_BYTES
                       + 4 * (bit<32>)hdr.ina.nlanes
                       + item * (bit<32>)hdr.ina.block_size * npresent;
        // The frame must hold the whole UDP datagram (ihl is 5: the parser took no options).
        bit<32> frame_needs = (bit<32>)ETH_HDR_BYTES + (bit<32>)IPV4_HDR_BYTES
                              + (bit<32>)hdr.udp.length;
        malformed = std.parser_error != error.NoError
            || !hdr.ina.isValid()
            || hdr.ina.version != INA_VERSION
            || (meta.fab.from_spine ? hdr.ina.msg_type != MSG_RESULT
                                      && hdr.ina.msg_type != MSG_STATUS
                                    : hdr.ina.msg_type != MSG_CONTRIB
                                      && hdr.ina.msg_type != MSG_GATHER)
            || hdr.ina.nlanes == 0 || hdr.ina.nlanes > WIRE_MAX_LANES
            || hdr.ina.block_size == 0
            || hdr.ina.rank >= WIRE_MAX_WORKERS
            || (hdr.ina.present >> hdr.ina.nlanes) != 0
            || (hdr.ina.nonfinite >> hdr.ina.nlanes) != 0
            || width == FLAGS_LANE_WIDTH
            || (bit<32>)hdr.udp.length != want
            || std.packet_length < frame_needs;
        if (malformed) {
            port_malformed.count((bit<32>)std.ingress_port);
        }
    }
}

#endif
