/* SpINA: the state of the slots, shared by the Aggregator (aggregator.p4) and, at a leaf, the
 * spine's answer (FromSpine, fabric.p4): registers and job counters at the top level, so that
 * both controls reach the same arrays under the same global names (softswitch/pipeline.py's
 * Pipeline.registers and counters, which softswitch/fabric.py reaches the same way).
 *
 * Per slot and shadow copy, idx = slot * 2 + (round & 1):
 *   slot_round        round tag of the copy: an older round is stale, a newer one resets the
 *                     copy (slots clean themselves; the control plane never clears them)
 *   slot_bitmap       ranks that contributed to this round (duplicates are not added twice)
 *   slot_count        contributions so far; complete at the job's worker count
 *   slot_values_l*_e* one array per lane and element: the int32 sums (wrap-around)
 *   slot_next_l*      one array per lane: minimum of the workers' next block positions
 *   slot_present      OR of the lanes that carried data
 *   slot_nonfinite    OR of the lanes that held NaN/Inf at some worker
 *   slot_exponent     max of the workers' exponents (signed)
 *   slot_length       tensor length of the round's first packet
 *   slot_flags        LAST (AND over contributions), MISMATCH (some length differed)
 *
 * Per slot, both copies' shared state (the hold of a newer round; softswitch/pipeline.py and
 * docs/reliability.md say why):
 *   head_round        newest round started on the slot
 *   head_heard        ranks heard at head_round (any packet of it, or a held newer one)
 *   head_missing      workers not yet heard at head_round (0 after a clear)
 * A round newer than head_round takes the copy of the round before last only when its
 * sender is the last worker missing or none is; otherwise it is held: dropped, job_held.
 *
 *
 * The job_* counters count, per job, what the Aggregator and FromSpine did with a packet.
 */
#ifndef SPINA_SLOTS_P4
#define SPINA_SLOTS_P4

@name(".job_received")   counter(MAX_JOBS, CounterType.packets) job_received;
@name(".job_aggregated") counter(MAX_JOBS, CounterType.packets) job_aggregated;
@name(".job_duplicates") counter(MAX_JOBS, CounterType.packets) job_duplicates;
@name(".job_stale")      counter(MAX_JOBS, CounterType.packets) job_stale;
@name(".job_held")       counter(MAX_JOBS, CounterType.packets) job_held;
// Narrow lanes (docs/bits.md): result packets with a sum clipped to its lane's range;
// contributions of another lane width than their round's first.
@name(".job_lane_saturated") counter(MAX_JOBS, CounterType.packets) job_lane_saturated;
@name(".job_lane_mismatch")  counter(MAX_JOBS, CounterType.packets) job_lane_mismatch;

@name(".slot_round")     register<bit<32>>(SLOT_COPIES) slot_round;
@name(".slot_bitmap")    register<bit<32>>(SLOT_COPIES) slot_bitmap;
@name(".slot_count")     register<bit<32>>(SLOT_COPIES) slot_count;
@name(".slot_present")   register<bit<64>>(SLOT_COPIES) slot_present;
@name(".slot_nonfinite") register<bit<64>>(SLOT_COPIES) slot_nonfinite;
@name(".slot_exponent")  register<bit<16>>(SLOT_COPIES) slot_exponent;
@name(".slot_length")    register<bit<32>>(SLOT_COPIES) slot_length;
@name(".slot_flags")     register<bit<8>>(SLOT_COPIES)  slot_flags;
@name(".head_round")     register<bit<32>>(POOL_SLOTS)  head_round;
@name(".head_heard")     register<bit<32>>(POOL_SLOTS)  head_heard;
@name(".head_missing")   register<bit<8>>(POOL_SLOTS)   head_missing;

// Generated from NLANES and BLOCK_SIZE (v1model/size.p4); global names so that the
// controller and the Thrift runtime find them as slot_next_l<L>, slot_values_l<L>_e<E>.
#define SPINA_NEXT_REG(L) \
@name(SPINA_XSTR(.slot_next_l##L)) register<bit<32>>(SLOT_COPIES) slot_next_l##L;
FOR_EACH_LANE(SPINA_NEXT_REG)

#define SPINA_VALUE_REG(L, E) \
@name(SPINA_XSTR(.slot_values_l##L##_e##E)) register<bit<32>>(SLOT_COPIES) slot_values_l##L##_e##E;
#define SPINA_LANE_VALUE_REGS(L) FOR_EACH_ELEM(SPINA_VALUE_REG, L)
FOR_EACH_LANE(SPINA_LANE_VALUE_REGS)

// The reply leaves from the switch's address to the sender's; egress rewrites the
// destination of each multicast copy for its worker. @hidden: called from apply only, it is
// no control-plane action (p4c would otherwise list it in the P4Info).
@hidden action reply_to_sender(inout headers_t hdr, inout metadata_t meta) {
    mac_addr_t mac = hdr.ethernet.dst_addr;
    hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
    hdr.ethernet.src_addr = mac;
    ipv4_addr_t addr = hdr.ipv4.dst_addr;
    hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
    hdr.ipv4.src_addr = addr;
    bit<16> port = hdr.udp.dst_port;
    hdr.udp.dst_port = hdr.udp.src_port;
    hdr.udp.src_port = port;
    hdr.udp.checksum = 0;  // RFC 768: zero means "no checksum" over IPv4
    meta.ipv4_update = true;
    meta.ina_emitted = true;
}


// A result's lengths: header, positions and the blocks now valid.
#define SPINA_COUNT_BLOCK(L) if (hdr.block[L].isValid()) { nblocks = nblocks + 1; }
#define SPINA_COUNT_NARROW(L) if (hdr.block16[L].isValid()) { n16 = n16 + 1; } \
                              if (hdr.block8[L].isValid()) { n8 = n8 + 1; }
#define SPINA_SET_LENGTHS {                                                  \
        bit<16> nblocks = 0;                                                 \
        bit<16> n16 = 0;                                                     \
        bit<16> n8 = 0;                                                      \
        FOR_EACH_LANE(SPINA_COUNT_BLOCK)                                     \
        FOR_EACH_LANE(SPINA_COUNT_NARROW)                                    \
        hdr.udp.length = UDP_HDR_BYTES + INA_HDR_BYTES + 4 * (bit<16>)hdr.ina.nlanes \
                         + nblocks * BLOCK_BYTES + n16 * (BLOCK_BYTES / 2)   \
                         + n8 * (BLOCK_BYTES / 4);                           \
        hdr.ipv4.total_len = IPV4_HDR_BYTES + hdr.udp.length;                \
    }

#endif
