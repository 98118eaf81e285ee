/* SpINA on Tofino 1 (TNA): the types whose widths are the architecture's, beside
 * p4src/shared/define.p4, which holds none (p4src/v1model/define_v1model.p4 is BMv2's).
 */
#ifndef SPINA_DEFINE_TNA_P4
#define SPINA_DEFINE_TNA_P4

typedef PortId_t port_t;     // tna.p4's port (shared/header.p4's fabric_t names port_t)
typedef bit<19>  qdepth_t;   // egress_intrinsic_metadata_t.enq_qdepth

#endif
