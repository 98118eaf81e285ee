/* SpINA: which INA packets this switch terminates, and who may contribute to which job.
 *
 * ina_endpoint: INA packets addressed to one of the switch's own IPv4 addresses are aggregated
 * here; any other INA packet (for example on a leaf on its way to the aggregating spine) takes
 * ordinary forwarding.
 *
 * admission: the sender's identity (ingress port, IPv4 source, UDP source port) together with
 * the (job, rank) it claims, all exact, so that a host cannot speak for another job or rank.
 * A hit gives the job's slot range, worker count, sizes and multicast group. A miss, a slot
 * outside the job's range or sizes other than the job's are dropped and counted per port.
 * At a leaf, a spine's answer (meta.fab.from_spine, v1model/fabric.p4) is admitted
 * instead when it comes from the spine owning the slot (leaf_upstream: ingress port, IPv4
 * source, UDP source port INA_UDP_PORT) for a job this switch is a leaf of.
 * The all-gather (MSG_GATHER) is a flat job's: at a leaf or a spine of the job it is
 * unadmitted (softswitch FabricRoles.route_into).
 */
#ifndef SPINA_ADMISSION_P4
#define SPINA_ADMISSION_P4

control InaEndpoint(in headers_t hdr, inout metadata_t meta) {
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

control Admission(in headers_t hdr, inout metadata_t meta, in standard_metadata_t std) {
    @name(".port_unadmitted") counter(MAX_PORTS, CounterType.packets) port_unadmitted;

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
    }

    @name(".reject")
    action reject() {
        meta.adm.hit = false;
    }

    @name(".admission")
    table admission {
        key = {
            std.ingress_port:  exact @name("ingress_port");
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
        if (meta.fab.from_spine) {
            // Sizes the parser holds: a spine's packet meets no admit entry to check them.
            meta.adm.hit = meta.fab.leaf && std.ingress_port == meta.fab.up_port
                && hdr.ipv4.src_addr == meta.fab.up_addr && hdr.udp.src_port == INA_UDP_PORT
                && hdr.ina.nlanes <= NLANES && hdr.ina.block_size == BLOCK_SIZE;
            if (!meta.adm.hit) {
                port_unadmitted.count((bit<32>)std.ingress_port);
            }
            return;
        }
        admission.apply();
        // 32-bit arithmetic: slot_base + nslots may exceed 16 bits.
        if (meta.adm.hit && ((bit<32>)hdr.ina.slot < (bit<32>)meta.adm.slot_base
                || (bit<32>)hdr.ina.slot >= (bit<32>)meta.adm.slot_base + (bit<32>)meta.adm.nslots
                || hdr.ina.nlanes != meta.adm.nlanes
                || hdr.ina.block_size != meta.adm.block_size
                // The parser holds NLANES blocks of BLOCK_SIZE: the controller admits no other
                // sizes; this guard only protects the registers from a wrong entry.
                || hdr.ina.nlanes > NLANES || hdr.ina.block_size != BLOCK_SIZE
                || (hdr.ina.msg_type == MSG_GATHER && (meta.fab.leaf || meta.fab.spine)))) {
            meta.adm.hit = false;
        }
        if (!meta.adm.hit) {
            port_unadmitted.count((bit<32>)std.ingress_port);
        }
    }
}

#endif
