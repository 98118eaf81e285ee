/* SpINA on Tofino 1: priority and drop, as p4src/v1model/priority.p4. Ingress: the INA
 * priority class picks the egress queue and the ingress class of service. Egress: the
 * congestion drop of loss-tolerant contributions, within the job's loss credit.
 */
#ifndef SPINA_TNA_PRIORITY_P4
#define SPINA_TNA_PRIORITY_P4

// The INA priority class (3 bits, as v1model's priority) picks the egress queue and the
// ingress class of service; the port's queues are the control plane's (TM configuration).
// Applied to forwarded packets and to a reply's last pass only: the passes through the
// recirculation port keep queue 0 (aggregator.p4), and no condition here waits for the
// aggregator's last writes (which would take two more stages).
control Priority(in tna_headers_t hdr, inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    apply {
        if (hdr.ina.isValid()) {
            ig_tm_md.qid = (QueueId_t)hdr.ina.priority[2:0];
            ig_tm_md.ingress_cos = hdr.ina.priority[2:0];
        }
    }
}

// The loss budget of p4src priority.p4: credit earns `bound` per contribution seen, saturating
// at LOSS_CREDIT_MAX, and a drop pays LOSS_CREDIT_ONE when the credit holds it.
control CongestionDrop(inout tna_headers_t hdr, inout tna_egress_md_t meta,
                       in egress_intrinsic_metadata_t eg_intr_md,
                       inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    @name(".job_congestion_drops")
    Counter<bit<32>, bit<11>>(MAX_JOBS, CounterType_t.PACKETS) job_congestion_drops;
    @name(".job_congestion_seen")
    Counter<bit<32>, bit<11>>(MAX_JOBS, CounterType_t.PACKETS) job_congestion_seen;
    @name(".job_loss_credit")
    Register<loss_credit_t, bit<11>>(MAX_JOBS, 0) job_loss_credit;

    // Not eligible for a drop: earn only.
    RegisterAction<loss_credit_t, bit<11>, pred_t>(job_loss_credit) earn = {
        void apply(inout loss_credit_t value) {
            if (value + meta.loss_bound > LOSS_CREDIT_MAX) {
                value = LOSS_CREDIT_MAX;
            } else {
                value = value + meta.loss_bound;
            }
        }
    };
    // Eligible: earn, then pay one packet if credit + bound >= LOSS_CREDIT_ONE (rv PRED_LO:
    // drop). p4src saturates the earned credit before paying (a drop from a full budget
    // leaves LOSS_CREDIT_MAX - LOSS_CREDIT_ONE); that is a third outcome, and a Tofino 1
    // stateful ALU writes a 32-bit cell from two ALUs only, so here such a drop leaves
    // credit + bound - LOSS_CREDIT_ONE: up to bound - 1 more (below one packet; the bound
    // and the burst cap hold as they are: credit is never above LOSS_CREDIT_MAX).
    RegisterAction<loss_credit_t, bit<11>, pred_t>(job_loss_credit) earn_and_pay = {
        void apply(inout loss_credit_t value, out pred_t rv) {
            rv = this.predicate(value >= meta.loss_need);
            if (value >= meta.loss_need) {
                value = value - meta.loss_need;
            } else {
                value = value + meta.loss_bound;
            }
        }
    };

    // enq_qdepth > qdepth: the threshold minus the depth saturates at 0 and they differ
    // (action data can only be an ALU's first operand).
    @name(".set_congestion")
    action set_congestion(qdepth_t qdepth, loss_bound_t bound) {
        meta.qdepth_room = qdepth |-| eg_intr_md.enq_qdepth;
        meta.qdepth_differs = qdepth ^ eg_intr_md.enq_qdepth;
        meta.loss_bound = (bit<32>)bound;
    }

    // What a drop takes from the credit just earned: LOSS_CREDIT_ONE - bound (an action of
    // its own: next to the counter's hash index its constant would be action data).
    @hidden action measure_loss_need() {
        meta.loss_need = LOSS_CREDIT_ONE - meta.loss_bound;
    }
    @hidden table loss_need {
        actions = { measure_loss_need; }
        const default_action = measure_loss_need();
        size = 1;
    }

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
                bit<11> job = hdr.ina.job[10:0];
                job_congestion_seen.count(job);
                loss_need.apply();
                // Eligible: loss-tolerant and the queue deeper than the threshold.
                bool eligible = false;
                if ((hdr.ina.flags & FLAG_LOSS_TOLERANT) != 0 && meta.qdepth_room == 0
                        && meta.qdepth_differs != 0) {
                    eligible = true;
                }
                pred_t paid = PRED_NONE;
                if (eligible) {
                    paid = earn_and_pay.execute(job);
                } else {
                    earn.execute(job);
                }
                if (paid != PRED_NONE) {
                    job_congestion_drops.count(job);
                    eg_dprsr_md.drop_ctl = 1;
                }
            }
        }
    }
}

#endif
