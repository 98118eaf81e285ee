/* SpINA for BMv2 simple_switch_grpc (v1model): includes, instantiates and sequences the
 * feature controls beside it (v1model only: they take standard_metadata). Build: `make p4` (p4src/README.md).
 *
 * Ingress: an INA packet for this switch (ina_endpoint) is checked, admitted and aggregated;
 * everything else is forwarded (l2, then ipv4_routes). The job's level on this switch (flat,
 * leaf or spine: FabricRoles, by table entries) decides where a completed round goes. Egress: a
 * reduce-scatter result's copies stripped for the ranks owning none of its blocks (ScatterStrip),
 * per-worker rewrite of result copies, then the loss-tolerant drop under congestion.
 */
#include <core.p4>
#include <v1model.p4>

#include "../shared/define.p4"
#include "define_v1model.p4"
#include "size.p4"
#include "../shared/header.p4"
#include "parser.p4"
#include "ina_check.p4"
#include "admission.p4"
#include "slots.p4"
#include "fabric.p4"
#include "aggregator.p4"
#include "forwarding.p4"
#include "priority.p4"
#include "scatter_strip.p4"
#include "egress_rewrite.p4"

control SpinaIngress(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t std) {
    InaEndpoint() ina_endpoint_ctl;
    InaCheck() ina_check_ctl;
    FabricRoles() fabric_roles_ctl;
    Admission() admission_ctl;
    Aggregator() aggregator_ctl;
    FromSpine() from_spine_ctl;
    Forwarding() forwarding_ctl;
    Priority() priority_ctl;

    apply {
        meta.ina_emitted = false;
        meta.ipv4_update = false;
        meta.owners = 0;
        ina_endpoint_ctl.apply(hdr, meta);
        if (meta.ina_local) {
            fabric_roles_ctl.apply(hdr, meta);
            bool malformed;
            ina_check_ctl.apply(hdr, meta, std, malformed);
            if (malformed) {
                mark_to_drop(std);
            } else {
                admission_ctl.apply(hdr, meta, std);
                if (meta.adm.hit && meta.fab.from_spine) {
                    from_spine_ctl.apply(hdr, meta, std);
                } else if (meta.adm.hit) {
                    if (hdr.ina.msg_type == MSG_CONTRIB && !meta.fab.spine) {
                        meta.owners = hdr.ina.bitmap;  // before the Aggregator writes it
                    }
                    aggregator_ctl.apply(hdr, meta, std);
                } else {
                    mark_to_drop(std);
                }
            }
        } else {
            forwarding_ctl.apply(hdr, meta, std);
        }
        priority_ctl.apply(hdr, std);
    }
}

control SpinaEgress(inout headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t std) {
    ScatterStrip() scatter_strip_ctl;
    WorkerRewrite() worker_rewrite_ctl;
    CongestionDrop() congestion_drop_ctl;

    apply {
        scatter_strip_ctl.apply(hdr, meta, std);
        worker_rewrite_ctl.apply(hdr, meta, std);
        congestion_drop_ctl.apply(hdr, std);
    }
}

V1Switch(SpinaParser(), SpinaVerifyChecksum(), SpinaIngress(), SpinaEgress(),
         SpinaComputeChecksum(), SpinaDeparser()) main;
