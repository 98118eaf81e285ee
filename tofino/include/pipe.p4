/* SpINA on Tofino 1: the ingress and egress controls that sequence the feature controls, the
 * pipe and the switch; included last by each profile's top file (tofino/spina_tna.p4,
 * spina_tna_roles.p4), whose profile file defines the roles' hooks (include/profile_flat.p4).
 *
 * Ingress: an INA packet for this switch (ina_endpoint) is checked, admitted and aggregated
 * (its block_i elements); everything else is forwarded (l2, then ipv4_routes). Egress: the
 * block_e elements (EgressSlots) on a pass through the recirculation port; then a held
 * contribution is dropped, a reply goes round into its next pass (three in all), and every
 * packet that leaves gets the per-worker rewrite of result copies, the result counter and the
 * loss-tolerant drop under congestion.
 */
#ifndef SPINA_TNA_PIPE_P4
#define SPINA_TNA_PIPE_P4

// Empty but in tofino/testgen/*.p4, which give P4Testgen assumptions (testgen_assume) here to
// steer its paths (tofino/testgen/README.md); bf-p4c's program has no trace of it.
#ifndef SPINA_TESTGEN_ASSUME
#define SPINA_TESTGEN_ASSUME
#endif

control SpinaIngress(inout tna_headers_t hdr, inout tna_ingress_md_t meta,
                     in ingress_intrinsic_metadata_t ig_intr_md,
                     in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                     inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                     inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    InaEndpoint() ina_endpoint_ctl;
    InaCheck() ina_check_ctl;
    Admission() admission_ctl;
    PortCounters() port_counters_ctl;
    SlotIndex() slot_index_ctl;
    Aggregator() aggregator_ctl;
    Forwarding() forwarding_ctl;
    Priority() priority_ctl;
    SPINA_ROLE_INGRESS_CONTROLS  // roles' profile: FabricRoles

    apply {
        SPINA_ROLE_INGRESS_FIRST  // roles' profile: FabricRoles first
        hdr.bridge.setValid();
        hdr.bridge.ina_emitted = 0;
        hdr.bridge.ipv4_update = 0;
        hdr.bridge.hold_drop = 0;
        hdr.bridge.to_harvest = 0;
        hdr.bridge.block_front = 0;
        hdr.bridge.read_hi = 0;
        hdr.bridge.last = 0;
        hdr.bridge.zero_front = 0;
        hdr.bridge.pad1 = 0;
        hdr.bridge.value_op = OP_NONE;
        hdr.bridge.pad2 = 0;
        hdr.bridge.reply_port = 0;
        hdr.bridge.mcast_grp = 0;
        hdr.bridge.pad3 = 0;
        hdr.bridge.idx = 0;
        meta.harvest = hdr.harvest.isValid();
        if (meta.harvest) {
            // A reply back from the recirculation port: its harvest pass (aggregator.p4).
            meta.gate = GATE_AGGREGATE;
            meta.slot_room = 1;
        } else {
            // Stage 0 looks everything up at once (each lookup keys on header fields only);
            // Admission's gate table sorts the packet in stage 1.
            ina_endpoint_ctl.apply(hdr, meta);
            ina_check_ctl.apply(hdr, ig_prsr_md.parser_err, meta);
            admission_ctl.apply(hdr, meta, ig_intr_md.ingress_port);
        }
        slot_index_ctl.apply(hdr, meta);
        SPINA_TESTGEN_ASSUME
        if (meta.gate == GATE_FORWARD) {
            forwarding_ctl.apply(hdr, ig_dprsr_md, ig_tm_md);
            priority_ctl.apply(hdr, ig_tm_md);
        } else if (meta.gate == GATE_MALFORMED || meta.gate == GATE_UNADMITTED
                   || meta.slot_room == 0) {  // slot_room 0: above the job's slot range
            port_counters_ctl.apply(meta, ig_intr_md.ingress_port, ig_dprsr_md);
        } else {
            aggregator_ctl.apply(hdr, meta, ig_intr_md, ig_dprsr_md, ig_tm_md);
        }
    }
}

control SpinaEgress(inout tna_headers_t hdr, inout tna_egress_md_t meta,
                    in egress_intrinsic_metadata_t eg_intr_md,
                    in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                    inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                    inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    EgressSlots() egress_slots_ctl;
    WorkerRewrite() worker_rewrite_ctl;
    CongestionDrop() congestion_drop_ctl;

    apply {
        // A pass through the recirculation port (the only passes whose value_op is not
        // OP_NONE) and the others (forwarded packets, a reply's last pass) in the two branches
        // of one if: bf-p4c then places the egress pairs beside CongestionDrop's stages (on
        // Tofino 1 a sequence waits for a branch nested in it once that has begun:
        // tofino/README.md, "Toward 64").
        if (hdr.bridge.hold_drop == 1 || hdr.bridge.to_harvest == 1) {
            egress_slots_ctl.apply(hdr);
            if (hdr.bridge.hold_drop == 1) {
                eg_dprsr_md.drop_ctl = 1;  // a held contribution: added, nothing leaves
            } else {
                // Round the recirculation port into the reply's next pass (include/parser.p4).
                hdr.harvest.setValid();
                hdr.harvest.pad0 = 0;
                hdr.harvest.pad1 = 0;
                hdr.harvest.pad2 = 0;
                if (hdr.bridge.last == 1) {
                    hdr.harvest.last = 1;
                } else {
                    hdr.harvest.last = 0;
                }
                if (hdr.block_e.isValid()) {
                    hdr.harvest.block = 1;
                } else {
                    hdr.harvest.block = 0;
                }
                hdr.harvest.port = hdr.bridge.reply_port;
                hdr.harvest.mcast_grp = hdr.bridge.mcast_grp;
            }
        } else {
            worker_rewrite_ctl.apply(hdr, eg_intr_md, eg_dprsr_md);
            congestion_drop_ctl.apply(hdr, meta, eg_intr_md, eg_dprsr_md);
        }
    }
}

Pipeline(SpinaIngressParser(), SpinaIngress(), SpinaIngressDeparser(),
         SpinaEgressParser(), SpinaEgress(), SpinaEgressDeparser()) pipe;

Switch(pipe) main;

#endif
