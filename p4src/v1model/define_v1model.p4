/* SpINA on BMv2 (v1model): the types whose widths are the architecture's (standard_metadata's),
 * beside p4src/shared/define.p4, which holds none (tofino/include/define_tna.p4 is the TNA's).
 */
#ifndef SPINA_DEFINE_V1MODEL_P4
#define SPINA_DEFINE_V1MODEL_P4

typedef bit<9>  port_t;      // egress_spec, ingress_port
typedef bit<16> mcast_grp_t; // mcast_grp, egress_rid
typedef bit<19> qdepth_t;    // enq_qdepth

// enq_qdepth never exceeds this: the congestion threshold that never drops.
const qdepth_t QDEPTH_NEVER = 0x7ffff;

#endif
