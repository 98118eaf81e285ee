/* SpINA: priority and drop (DLCP: SGD tolerates a bounded loss of gradient packets).
 *
 * Ingress: the INA priority class selects the egress queue (simple_switch_grpc
 * --priority-queues 8; v1model priority is 3 bits). Egress: a loss-tolerant INA contribution
 * is dropped when its queue was deeper than its job's threshold at enqueue AND its job's loss
 * budget allows. Results and status packets are never dropped here: a lost result copy costs
 * its worker a resend, not gradient, and the aggregating switch consumes contributions in
 * ingress, so the contributions seen here are the ones on their way to an aggregator
 * (a leaf, an L2 hop), where a drop becomes a PARTIAL round (docs/dlcp.md, "Switch").
 *
 * The budget is the switch's, not the hosts': per job, a credit register earns `bound`
 * (1/LOSS_CREDIT_ONE packets) for every contribution seen and pays LOSS_CREDIT_ONE per drop,
 * saturating at LOSS_CREDIT_MAX. Drops never exceed floor(seen x bound / LOSS_CREDIT_ONE);
 * a host that flags every packet loss-tolerant loses no more. One read-modify-write of one
 * register cell per packet, adds and compares only (a Tofino stateful ALU's shape).
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
    // Contributions of a job with an entry: the budget's denominator.
    @name(".job_congestion_seen")
    counter(MAX_JOBS, CounterType.packets) job_congestion_seen;
    // Per job id: loss credit in 1/LOSS_CREDIT_ONE packets (0..LOSS_CREDIT_MAX).
    @name(".job_loss_credit")
    register<loss_credit_t>(MAX_JOBS) job_loss_credit;

    qdepth_t threshold = QDEPTH_NEVER;
    loss_credit_t bound_credit = 0;

    @name(".set_congestion")
    action set_congestion(qdepth_t qdepth, loss_bound_t bound) {
        threshold = qdepth;
        bound_credit = (loss_credit_t)bound;
    }

    // Per job; a miss (no bound installed) never drops and spends no register access.
    // Sized like admission: every job there has at least one admission entry.
    @name(".congestion")
    table congestion {
        key = {
            hdr.ina.job: exact @name("job");
        }
        actions = {
            set_congestion;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = ADMISSION_ENTRIES;
    }

    apply {
        if (hdr.ina.isValid() && hdr.ina.msg_type == MSG_CONTRIB) {
            if (congestion.apply().hit) {
                bit<32> job = (bit<32>)hdr.ina.job;
                job_congestion_seen.count(job);
                loss_credit_t credit;
                job_loss_credit.read(credit, job);
                // bound < LOSS_CREDIT_ONE and credit <= LOSS_CREDIT_MAX: no overflow.
                credit = credit + bound_credit;
                if (credit > LOSS_CREDIT_MAX) {
                    credit = LOSS_CREDIT_MAX;
                }
                if ((hdr.ina.flags & FLAG_LOSS_TOLERANT) != 0 && std.enq_qdepth > threshold
                        && credit >= LOSS_CREDIT_ONE) {
                    credit = credit - LOSS_CREDIT_ONE;
                    job_congestion_drops.count(job);
                    mark_to_drop(std);
                }
                job_loss_credit.write(job, credit);
            }
        }
    }
}

#endif
