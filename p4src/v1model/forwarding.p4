/* SpINA: ordinary forwarding for everything the switch does not aggregate.
 *
 * l2: exact match on the destination MAC (bridging within a segment). On a miss, an IPv4
 * packet is routed by longest prefix (ipv4_routes), which rewrites the MACs for the next hop
 * and decrements the TTL; anything else is dropped. The controller fills both tables.
 */
#ifndef SPINA_FORWARDING_P4
#define SPINA_FORWARDING_P4

control Forwarding(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    @name(".bridge")
    action bridge(port_t port) {
        std.egress_spec = port;
    }

    @name(".route")
    action route(port_t port, mac_addr_t src_mac, mac_addr_t dst_mac) {
        std.egress_spec = port;
        hdr.ethernet.src_addr = src_mac;
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
        meta.ipv4_update = true;
    }

    @name(".drop")
    action drop() {
        mark_to_drop(std);
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
            drop();  // shorter than an Ethernet header
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
