/* SpINA: per-worker rewrite of the copies the switch sends, and the result counter.
 *
 * The multicast group of a job replicates a result once per worker; the controller gives each
 * replica a replication id (rid) unique on the switch and a worker_rewrite entry with that
 * worker's MAC, IPv4 address and UDP port. Unicast replies (rid 0) already carry the sender's
 * address. An all-gather packet's copy addressed to its own sender is dropped. The IPv4 checksum is recomputed by SpinaComputeChecksum; the UDP checksum is zero.
 * job_results counts every result copy here, before the congestion check, as the software
 * switch counts nworkers per completed round.
 * A copy the switch wrote ends at its UDP length: bytes the contribution carried after its UDP
 * datagram (an Ethernet trailer) are unparsed payload to the deparser, so they are cut here
 * (the software switch never copies them). Here rather than in ingress: BMv2 does not carry an
 * ingress truncate over to multicast replicas.
 */
#ifndef SPINA_EGRESS_REWRITE_P4
#define SPINA_EGRESS_REWRITE_P4

control WorkerRewrite(inout headers_t hdr, in metadata_t meta, inout standard_metadata_t std) {
    @name(".job_results") counter(MAX_JOBS, CounterType.packets) job_results;

    @name(".rewrite_for_worker")
    action rewrite_for_worker(mac_addr_t dst_mac, ipv4_addr_t dst_addr, bit<16> dst_port) {
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.dst_addr = dst_addr;
        hdr.udp.dst_port = dst_port;
    }

    // A replica nobody configured cannot be addressed.
    @name(".drop_replica")
    action drop_replica() {
        mark_to_drop(std);
    }

    @name(".worker_rewrite")
    table worker_rewrite {
        key = {
            std.egress_rid: exact @name("rid");
        }
        actions = {
            rewrite_for_worker;
            @defaultonly drop_replica;
        }
        default_action = drop_replica();
        size = MAX_RIDS;
    }

    apply {
        if (meta.ina_emitted) {
            truncate((bit<32>)ETH_HDR_BYTES + (bit<32>)IPV4_HDR_BYTES + (bit<32>)hdr.udp.length);
            // An all-gather packet's sender (reply_to_sender addressed the copies to it) has
            // its own shard: its replica is dropped.
            ipv4_addr_t sender_addr = hdr.ipv4.dst_addr;
            bit<16> sender_port = hdr.udp.dst_port;
            if (std.egress_rid != 0) {
                worker_rewrite.apply();
                if (hdr.ina.msg_type == MSG_GATHER && hdr.ipv4.dst_addr == sender_addr
                        && hdr.udp.dst_port == sender_port) {
                    mark_to_drop(std);
                }
            }
            if (hdr.ina.msg_type == MSG_RESULT) {
                job_results.count((bit<32>)hdr.ina.job);
            }
        }
    }
}

#endif
