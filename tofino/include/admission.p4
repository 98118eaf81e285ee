/* SpINA on Tofino 1: which INA packets this switch terminates (ina_endpoint), whether they
 * are well formed at the sizes this program aggregates (InaCheck), and who may contribute to
 * which job (admission). Same tables, keys and actions as p4src/include/control/
 * admission.p4 and ina_check.p4 (spina/spec.py); the arithmetic is split over stages
 * because a Tofino stage compares a field with a constant, not two fields by size.
 *
 * InaCheck here: wire.check_header at NLANES / BLOCK_SIZE only. A packet with other sizes
 * is malformed (port_malformed), where the software switch and p4src find such a packet
 * well formed and then unadmitted (port_unadmitted): the parser holds one lane of
 * BLOCK_SIZE elements, so the UDP length cannot be checked against other sizes without a
 * multiplier. Either way it is dropped and counted per ingress port.
 */
#ifndef SPINA_TNA_ADMISSION_P4
#define SPINA_TNA_ADMISSION_P4

control InaEndpoint(in tna_headers_t hdr, inout tna_ingress_md_t meta) {
    @name(".accept_ina")
    action accept_ina() {
        meta.ina_local = true;
    }

    @name(".ina_endpoint")
    table ina_endpoint {
        key = {
            hdr.ipv4.dst_addr: exact @name("dst_addr");
        }
        actions = {
            accept_ina;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = INA_ENDPOINT_ENTRIES;
    }

    apply {
        meta.ina_local = false;
        if (hdr.udp.isValid() && hdr.udp.dst_port == INA_UDP_PORT) {
            ina_endpoint.apply();
        }
    }
}

control InaCheck(in tna_headers_t hdr, in bit<16> parser_err, in PortId_t ingress_port,
                 out bool malformed) {
    @name(".port_malformed") Counter<bit<32>, PortId_t>(MAX_PORTS, CounterType_t.PACKETS)
        port_malformed;

    apply {
        // The UDP length of a well-formed packet at these sizes: header, one position and
        // the block when present bit 0 is set (wire.packet_len + the UDP header).
        bit<16> want = UDP_HDR_BYTES + INA_HDR_BYTES + 4 * NLANES;
        if (hdr.ina.present[0:0] == 1) {
            want = want + BLOCK_BYTES;
        }
        malformed = parser_err != 0
            || !hdr.ina.isValid()
            || hdr.ina.version != INA_VERSION
            || hdr.ina.msg_type != MSG_CONTRIB
            || hdr.ina.nlanes != NLANES || hdr.ina.block_size != BLOCK_SIZE
            || hdr.ina.rank >= WIRE_MAX_WORKERS
            || hdr.ina.present[63:NLANES] != 0
            || hdr.ina.nonfinite[63:NLANES] != 0
            || hdr.udp.length != want;
        if (malformed) {
            port_malformed.count(ingress_port);
        }
    }
}

control Admission(in tna_headers_t hdr, inout tna_ingress_md_t meta, in PortId_t ingress_port) {
    @name(".port_unadmitted") Counter<bit<32>, PortId_t>(MAX_PORTS, CounterType_t.PACKETS)
        port_unadmitted;

    // Action data meets header fields here, once: the slot's offset in the job's range and
    // the epoch's difference are computed with the lookup (one stage saved).
    @name(".admit")
    action admit(bit<16> epoch, bit<16> slot_base, bit<16> nslots, bit<8> nworkers,
                 bit<16> block_size, bit<8> nlanes, bit<16> mcast_grp) {
        meta.adm.hit = true;
        meta.adm.epoch = epoch;
        meta.adm.slot_base = slot_base;
        meta.adm.nslots = nslots;
        meta.adm.nworkers = nworkers;
        meta.adm.block_size = block_size;
        meta.adm.nlanes = nlanes;
        meta.adm.mcast_grp = mcast_grp;
        meta.nworkers = (bit<32>)nworkers;
        meta.slot_off = (bit<32>)hdr.ina.slot - (bit<32>)slot_base;
        meta.epoch_diff = hdr.ina.epoch ^ epoch;
    }

    @name(".reject")
    action reject() {
        meta.adm.hit = false;
    }

    @name(".admission")
    table admission {
        key = {
            ingress_port:      exact @name("ingress_port");
            hdr.ipv4.src_addr: exact @name("src_addr");
            hdr.udp.src_port:  exact @name("src_port");
            hdr.ina.job:       exact @name("job");
            hdr.ina.rank:      exact @name("rank");
        }
        actions = {
            admit;
            reject;
        }
        default_action = reject();
        size = ADMISSION_ENTRIES;
    }

    apply {
        meta.adm.hit = false;
        admission.apply();
        // Inside [slot_base, slot_base + nslots): slot_off did not wrap and is below nslots
        // (32-bit arithmetic on 16-bit values: bit 31 is the sign of each difference).
        meta.slot_past = meta.slot_off - (bit<32>)meta.adm.nslots;
        // The parser holds NLANES blocks of BLOCK_SIZE (and InaCheck let only those sizes
        // through): the controller admits no other sizes; this guards the registers from a
        // wrong entry, as p4src does.
        if (meta.adm.hit && (meta.slot_off[31:31] == 1 || meta.slot_past[31:31] == 0
                || meta.adm.nlanes != NLANES || meta.adm.block_size != BLOCK_SIZE)) {
            meta.adm.hit = false;
        }
        if (!meta.adm.hit) {
            port_unadmitted.count(ingress_port);
        }
    }
}

#endif
