/* SpINA on Tofino 1: ordinary forwarding (l2, ipv4_routes). Same tables, keys and actions as
 * p4src/v1model/forwarding.p4.
 */
#ifndef SPINA_TNA_FORWARDING_P4
#define SPINA_TNA_FORWARDING_P4

control Forwarding(inout tna_headers_t hdr,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    @name(".bridge")
    action bridge(PortId_t port) {
        ig_tm_md.ucast_egress_port = port;
    }

    @name(".route")
    action route(PortId_t port, mac_addr_t src_mac, mac_addr_t dst_mac) {
        ig_tm_md.ucast_egress_port = port;
        hdr.ethernet.src_addr = src_mac;
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
        hdr.bridge.ipv4_update = 1;
    }

    @name(".drop")
    action drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    @name(".l2")
    table l2 {
        key = {
            hdr.ethernet.dst_addr: exact @name("dst_mac");
        }
        actions = {
            bridge;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = L2_ENTRIES;
    }

    @name(".ipv4_routes")
    table ipv4_routes {
        key = {
            hdr.ipv4.dst_addr: lpm @name("dst_addr");
        }
        actions = {
            route;
            drop;
        }
        default_action = drop();
        size = IPV4_ENTRIES;
    }

    apply {
        if (!hdr.ethernet.isValid()) {
            drop();
        } else if (!l2.apply().hit) {
            if (hdr.ipv4.isValid()) {
                ipv4_routes.apply();
            } else {
                drop();
            }
        }
    }
}

#endif
