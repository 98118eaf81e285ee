/* SpINA on Tofino 1 (egress): per-worker rewrite of the result copies and the result
 * counter. Same tables, keys, actions and counters as p4src/v1model/egress_rewrite.p4.
 *
 * TNA has no truncate: bytes a contribution carried after its UDP datagram (an Ethernet
 * trailer) still follow a reply built from it (p4src cuts them). The IPv4 and UDP lengths
 * are right; receivers read the datagram, not the frame.
 */
#ifndef SPINA_TNA_EGRESS_REWRITE_P4
#define SPINA_TNA_EGRESS_REWRITE_P4

control WorkerRewrite(inout tna_headers_t hdr, in egress_intrinsic_metadata_t eg_intr_md,
                      inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    @name(".job_results") Counter<bit<32>, bit<11>>(MAX_JOBS, CounterType_t.PACKETS) job_results;

    @name(".rewrite_for_worker")
    action rewrite_for_worker(mac_addr_t dst_mac, ipv4_addr_t dst_addr, bit<16> dst_port) {
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.dst_addr = dst_addr;
        hdr.udp.dst_port = dst_port;
    }

    // A replica nobody configured cannot be addressed.
    @name(".drop_replica")
    action drop_replica() {
        eg_dprsr_md.drop_ctl = 1;
    }

    @name(".worker_rewrite")
    table worker_rewrite {
        key = {
            eg_intr_md.egress_rid: exact @name("rid");
        }
        actions = {
            rewrite_for_worker;
            @defaultonly drop_replica;
        }
        default_action = drop_replica();
        size = MAX_RIDS;
    }

    apply {
        if (hdr.bridge.ina_emitted == 1) {
            if (eg_intr_md.egress_rid != 0) {
                worker_rewrite.apply();
            }
            if (hdr.ina.msg_type == MSG_RESULT) {
                job_results.count(hdr.ina.job[10:0]);
            }
        }
    }
}

#endif
