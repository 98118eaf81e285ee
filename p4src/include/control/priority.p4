/* SpINA: priority and drop (DLCP: SGD tolerates a bounded loss of gradient packets).
 *
 * Ingress: the INA priority class selects the egress queue (simple_switch_grpc
 * --priority-queues 8; v1model priority is 3 bits). Egress: an INA packet flagged
 * loss-tolerant is dropped when its queue was deeper than the controller's threshold at
 * enqueue, so that under congestion such packets go first.
 */
#ifndef SPINA_PRIORITY_P4
#define SPINA_PRIORITY_P4

control Priority(in headers_t hdr, inout standard_metadata_t std) {
    apply {
        if (hdr.ina.isValid()) {
            std.priority = hdr.ina.priority[2:0];
        }
    }
}

control CongestionDrop(in headers_t hdr, inout standard_metadata_t std) {
    @name(".job_congestion_drops")
    counter(MAX_JOBS, CounterType.packets) job_congestion_drops;

    qdepth_t threshold = QDEPTH_NEVER;

    @name(".set_qdepth_threshold")
    action set_qdepth_threshold(qdepth_t qdepth) {
        threshold = qdepth;
    }

    // Keyless: the controller sets the default action's parameter (QDEPTH_NEVER: never drop).
    @name(".congestion")
    table congestion {
        actions = {
            set_qdepth_threshold;
        }
        default_action = set_qdepth_threshold(QDEPTH_NEVER);
        size = 1;
    }

    apply {
        if (hdr.ina.isValid() && (hdr.ina.flags & FLAG_LOSS_TOLERANT) != 0) {
            congestion.apply();
            if (std.enq_qdepth > threshold) {
                job_congestion_drops.count((bit<32>)hdr.ina.job);
                mark_to_drop(std);
            }
        }
    }
}

#endif
