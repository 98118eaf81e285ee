/* SpINA on Tofino 1: the fabric roles' lookups (p4src/v1model/fabric.p4's FabricRoles), in the
 * roles' profile only (tofino/spina_tna_roles.p4; what the roles add to the other controls is
 * include/profile_roles.p4's). That profile is a measurement of what the leaf and spine roles
 * cost on Tofino 1 (tofino/README.md, "The hold and the roles on Tofino 1"): bf-p4c's answer,
 * not a program the controller deploys or a transliteration checks; the default program has
 * no roles.
 *
 * job_level (job): as_leaf carries the rack's bit and its local ranks' mask as action data
 * (Tofino 1 has no variable shift); leaf_upstream (job, slot): the slot's spine. Stage 0,
 * beside admission; the two tests that depend on them (from_spine, the rack's bit in the
 * spine's bitmap) in stage 1.
 */
#ifndef SPINA_TNA_FABRIC_P4
#define SPINA_TNA_FABRIC_P4

// What the roles add to decide's kinds: a packet that ends here (another worker's resend of
// a round whose spine result is missing goes up only from local rank 0 or as a flush).
const kind_t KIND_DROP = 6;

control FabricRoles(in tna_headers_t hdr, inout tna_ingress_md_t meta) {
    @name(".as_leaf")
    action as_leaf(bit<8> rack, bit<32> rack_bit, bit<32> all_local, bit<16> epoch) {
        meta.fab.leaf = true;
        meta.fab.rack = rack;
        meta.fab.rack_bit = rack_bit;
        meta.fab.all_local = all_local;
        meta.fab.epoch_diff = hdr.ina.epoch ^ epoch;
    }
    @name(".as_spine")
    action as_spine() {
        meta.fab.spine = true;
    }
    @name(".job_level")
    table job_level {
        key = { hdr.ina.job: exact @name("job"); }
        actions = { as_leaf; as_spine; @defaultonly NoAction; }
        default_action = NoAction();
        size = ADMISSION_ENTRIES;
    }

    @name(".to_spine")
    action to_spine(PortId_t port, bit<48> dst_mac, bit<32> dst_addr) {
        meta.fab.up = true;
        meta.fab.up_port = port;
        meta.fab.up_mac = dst_mac;
        meta.fab.up_addr = dst_addr;
    }
    @name(".leaf_upstream")
    table leaf_upstream {
        key = {
            hdr.ina.job:  exact @name("job");
            hdr.ina.slot: exact @name("slot");
        }
        actions = { to_spine; @defaultonly NoAction; }
        default_action = NoAction();
        size = POOL_SLOTS;
    }

    // What the packet is to the roles, from stage 0's answers in one lookup (as `if`s, each
    // its own branch, bf-p4c placed them one stage after another: tofino/README.md).
    @hidden action set_role_flags(bool from_spine, bool carry, bool store, bool replay,
                                  bool dup) {
        meta.fab.from_spine = from_spine;  // a RESULT or STATUS from the slot's spine
        meta.fab.carry = carry;            // a spine's partial, or the spine's answer
        meta.fab.store = store;            // the spine's RESULT: slot_count's count_store
        meta.fab.replay = replay;          // a leaf's REPLAY at a spine
        meta.fab.dup = dup;                // slot_count's count_duplicate (no rank counted)
    }
    @hidden table role_flags {
        key = {
            meta.fab.up:       ternary;
            meta.fab.spine:    ternary;
            hdr.ina.msg_type:  ternary;
            hdr.ina.flags:     ternary;
        }
        actions = { set_role_flags; @defaultonly NoAction; }
        const entries = {
            (true, _, MSG_RESULT, _): set_role_flags(true, true, true, false, true);
            (true, _, MSG_STATUS, _): set_role_flags(true, true, false, false, true);
            (_, true, _, FLAG_REPLAY &&& FLAG_REPLAY): set_role_flags(false, true, false, true, true);
            (_, true, _, _): set_role_flags(false, true, false, false, false);
        }
        const default_action = NoAction();
        size = 4;
    }

    apply {
        meta.fab.leaf = false;
        meta.fab.spine = false;
        meta.fab.rack = 0;
        meta.fab.rack_bit = 0;
        meta.fab.all_local = 0;
        meta.fab.epoch_diff = 0;
        meta.fab.up = false;
        meta.fab.up_port = 0;
        meta.fab.up_mac = 0;
        meta.fab.up_addr = 0;
        meta.fab.up_reply = 0;
        job_level.apply();
        leaf_upstream.apply();
        meta.fab.rack_hit = hdr.ina.bitmap & meta.fab.rack_bit;
        meta.fab.rank_diff = hdr.ina.rank ^ meta.fab.rack;
        meta.fab.from_spine = false;
        meta.fab.carry = false;
        meta.fab.store = false;
        meta.fab.replay = false;
        meta.fab.dup = false;
        role_flags.apply();
    }
}

#endif
