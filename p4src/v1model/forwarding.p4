/* SpINA: ordinary forwarding for everything the switch does not aggregate.
 *
 * l2: exact match on the destination MAC (bridging within a segment). On a miss, an IPv4
 * packet is routed by longest prefix (ipv4_routes), which rewrites the MACs for the next hop
 * and decrements the TTL; anything else is dropped. The controller fills these tables.
 *
 * Per-packet spraying: an l2 entry `spray(group, ways)` sends successive packets to the MAC
 * over the group's ports in turn: turn t = spray_turn[group] picks spray_ports (group, t),
 * and the register advances to t + 1, back to 0 at `ways`. Round-robin, not a hash: the
 * packets of one flow take every path (SpINA's rounds are order-independent; TCP's are not,
 * so the controller sprays only where asked). A turn at or beyond `ways` (the group shrank)
 * counts as 0; a turn without a spray_ports entry drops the packet.
 */
#ifndef SPINA_FORWARDING_P4
#define SPINA_FORWARDING_P4

typedef bit<8> spray_group_t;  // SPRAY_GROUPS groups
typedef bit<8> spray_turn_t;   // a group's turn, 0..ways-1

control Forwarding(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    // Per spray group: the turn its next packet takes (one read and one write per packet).
    @name(".spray_turn")
    register<spray_turn_t>(SPRAY_GROUPS) spray_turn;

    spray_group_t spray_group_sel = 0;
    spray_turn_t spray_ways = 0;
    spray_turn_t turn = 0;

    @name(".bridge")
    action bridge(port_t port) {
        std.egress_spec = port;
    }

    @name(".spray")
    action spray(spray_group_t group, spray_turn_t ways) {
        spray_group_sel = group;
        spray_ways = ways;
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
            spray;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = L2_ENTRIES;
    }

    @name(".spray_ports")
    table spray_ports {
        key = {
            spray_group_sel: exact @name("group");
            turn: exact @name("turn");
        }
        actions = {
            bridge;
            drop;
        }
        default_action = drop();
        size = SPRAY_PORT_ENTRIES;
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
        } else {
            switch (l2.apply().action_run) {
                bridge: {}
                spray: {
                    spray_turn.read(turn, (bit<32>)spray_group_sel);
                    if (turn >= spray_ways) {
                        turn = 0;  // the group shrank since its last packet
                    }
                    spray_turn_t next_turn = turn + 1;
                    if (next_turn >= spray_ways) {
                        next_turn = 0;  // compare and reset: no modulo in the pipeline
                    }
                    spray_turn.write((bit<32>)spray_group_sel, next_turn);
                    spray_ports.apply();
                }
                default: {  // a miss
                    if (hdr.ipv4.isValid()) {
                        ipv4_routes.apply();
                    } else {
                        drop();
                    }
                }
            }
        }
    }
}

#endif
