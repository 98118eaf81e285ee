/* SpINA on Tofino 1: which INA packets this switch terminates (ina_endpoint) and who may
 * contribute to which job (admission). Same tables, keys and actions as
 * p4src/v1model/admission.p4 (spina/spec.py); the arithmetic is split over stages because a
 * Tofino stage compares a field with a constant, not two fields by size. Whether a packet is
 * well formed is ina_check.p4's (InaCheck).
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

control Admission(in tna_headers_t hdr, inout tna_ingress_md_t meta, in PortId_t ingress_port) {
    // Action data meets header fields here, once: the slot's offset in the job's range and
    // the epoch's difference are computed with the lookup (stage 0).
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
        // Saturating differences keep the slot test exact in 16 bits (p4src widens to 32):
        // slot_below > 0 when slot < slot_base. A Tofino ALU takes action data as the first
        // operand only: slot - slot_base waits for the next stage (the gate's action).
        meta.slot_below = slot_base |-| hdr.ina.slot;
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

    // Stage 1: what the packet is, from stage 0's answers, in one lookup. The upper bound of
    // the slot range (slot_room) is computed in stages 1 and 2 and tested after.
    @hidden action set_gate(gate_t gate) {
        meta.gate = gate;
        meta.slot_off = hdr.ina.slot - meta.adm.slot_base;
    }
    // The slot's lower bound (slot_below == 0) and the admitted sizes are tested here;
    // the sizes are the parser's (InaCheck let only those through): the controller admits no
    // other sizes, so this guards the registers from a wrong entry, as p4src does.
    @hidden table gate {
        key = {
            meta.ina_local:        ternary;
            meta.malformed:        ternary;
            meta.adm.hit:          ternary;
            meta.slot_below:       ternary;
            meta.epoch_diff:       ternary;
            meta.adm.nlanes:       ternary;
            meta.adm.block_size:   ternary;
            SPINA_ROLE_GATE_KEYS  // roles' profile: up, msg_type, the spine's epoch
        }
        actions = { set_gate; }
        const entries = {
            (false, _, _, _, _, _, _ SPINA_GATE_ANY): set_gate(GATE_FORWARD);
            (true, true, _, _, _, _, _ SPINA_GATE_ANY): set_gate(GATE_MALFORMED);
            SPINA_ROLE_GATE_ENTRIES  // roles' profile: the spine's answers at a leaf
            (true, false, true, 0, 0, NLANES, BLOCK_SIZE SPINA_GATE_ANY): set_gate(GATE_AGGREGATE);
            (true, false, true, 0, _, NLANES, BLOCK_SIZE SPINA_GATE_ANY): set_gate(GATE_STALE_EPOCH);
        }
        const default_action = set_gate(GATE_UNADMITTED);
        size = GATE_ENTRIES;
    }

    // nslots - slot_off, saturated at 0, in an action of its own: as a plain statement the
    // compiler would fold it into the test of slot_room, which a stage's gateway cannot do.
    @hidden action measure_slot_room() {
        meta.slot_room = meta.adm.nslots |-| meta.slot_off;
    }
    @hidden table slot_range {
        actions = { measure_slot_room; }
        const default_action = measure_slot_room();
        size = 1;
    }

    apply {
        meta.gate = GATE_FORWARD;
        meta.adm.hit = false;
        meta.adm.nlanes = 0;
        meta.adm.block_size = 0;
        admission.apply();
        // Inside [slot_base, slot_base + nslots): slot_below is 0 (the gate), and slot_room,
        // nslots - (slot - slot_base) saturated at 0, is not (stages 1 and 2).
        gate.apply();  // also slot_off = slot - slot_base
        slot_range.apply();
    }
}

// Malformed and unadmitted INA packets carry no job id one can trust: counted per port
// (the top level decides which; unadmitted: the gate's verdict or a slot above the range).
control PortCounters(in tna_ingress_md_t meta, in PortId_t ingress_port,
                     inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    @name(".port_malformed") Counter<bit<32>, PortId_t>(MAX_PORTS, CounterType_t.PACKETS)
        port_malformed;
    @name(".port_unadmitted") Counter<bit<32>, PortId_t>(MAX_PORTS, CounterType_t.PACKETS)
        port_unadmitted;

    apply {
        if (meta.gate == GATE_MALFORMED) {
            port_malformed.count(ingress_port);
        } else {
            port_unadmitted.count(ingress_port);
        }
        ig_dprsr_md.drop_ctl = 1;
    }
}

#endif
