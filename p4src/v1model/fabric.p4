/* SpINA: the level a switch aggregates a job at, chosen by table entries (docs/scale_out.md;
 * softswitch/fabric.py is the software twin, packet by packet).
 *
 * job_level (job): no entry, the job is flat here (one switch aggregates all its workers);
 *   as_leaf: this switch aggregates one rack of the job (its workers send their rank within
 *   the rack, 0..nlocal-1, so a job has up to 32 racks x 32 workers) and sends each completed round up to
 *   the spine owning the slot, as one contribution of its own (rank = the rack's index), then
 *   stores the spine's result and replicates it to the rack; as_spine: the job's "workers" are
 *   its leaves (admission entries with rank = rack index), and a partial's MISMATCH and PARTIAL
 *   flags are ORed into the round.
 * leaf_upstream (job, slot): at a leaf, the spine owning the slot: its port, MAC and IPv4
 *   address (UDP port INA_UDP_PORT). A result or status for such a slot is the spine's answer
 *   (from_spine) when it comes from that spine; from anywhere else it is unadmitted.
 *
 * Both are looked up before InaCheck (a spine's RESULT/STATUS is well-formed at a leaf); the
 * Aggregator acts on meta.fab.
 */
#ifndef SPINA_FABRIC_P4
#define SPINA_FABRIC_P4

control FabricRoles(in headers_t hdr, inout metadata_t meta) {
    @name(".as_leaf")
    action as_leaf(bit<8> rack, bit<8> nlocal, bit<16> epoch, bit<16> mcast_grp) {
        meta.fab.leaf = true;
        meta.fab.rack = rack;
        meta.fab.nlocal = nlocal;
        meta.fab.epoch = epoch;
        meta.fab.mcast_grp = mcast_grp;
    }

    @name(".as_spine")
    action as_spine() {
        meta.fab.spine = true;
    }

    @name(".job_level")
    table job_level {
        key = {
            hdr.ina.job: exact @name("job");
        }
        actions = {
            as_leaf;
            as_spine;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = ADMISSION_ENTRIES;
    }

    @name(".to_spine")
    action to_spine(port_t port, mac_addr_t dst_mac, ipv4_addr_t dst_addr) {
        meta.fab.up = true;
        meta.fab.up_port = port;
        meta.fab.up_mac = dst_mac;
        meta.fab.up_addr = dst_addr;
    }

    // One entry per slot of a leaf job: a leaf's slots are at most the pool's.
    @name(".leaf_upstream")
    table leaf_upstream {
        key = {
            hdr.ina.job:  exact @name("job");
            hdr.ina.slot: exact @name("slot");
        }
        actions = {
            to_spine;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = POOL_SLOTS;
    }

    apply {
        meta.fab.leaf = false;
        meta.fab.spine = false;
        meta.fab.rack = 0;
        meta.fab.nlocal = 0;
        meta.fab.epoch = 0;
        meta.fab.mcast_grp = 0;
        meta.fab.up = false;
        meta.fab.up_port = 0;
        meta.fab.up_mac = 0;
        meta.fab.up_addr = 0;
        meta.fab.from_spine = false;
        if (hdr.ina.isValid()) {
            job_level.apply();
            leaf_upstream.apply();
            meta.fab.from_spine = meta.fab.up && hdr.ina.msg_type != MSG_CONTRIB;
        }
    }
}

#endif
