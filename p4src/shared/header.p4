/* SpINA: packet headers and the metadata the controls share.
 *
 * Ethernet II, IPv4 (RFC 791, no options), UDP (RFC 768), then the INA header. `ina_h` lists
 * exactly wire.HEADER_FIELDS (names, order, widths; the layout is drawn in spina/wire.py):
 *
 *   version:8 msg_type:8 flags:8 priority:8 | job:16 epoch:16 | call:32 |
 *   slot:16 rank:8 nlanes:8 | round:32 | length:32 | block_size:16 exponent:16 |
 *   bitmap:32 | present:64 | nonfinite:64                              (48 bytes)
 *
 * followed by nlanes 32-bit `next` positions (lane_next_h) and one BLOCK_SIZE-element block
 * (block_h) per lane whose `present` bit is set, in ascending lane order.
 */
#ifndef SPINA_HEADER_P4
#define SPINA_HEADER_P4

header ethernet_h {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16>    ether_type;
}

header ipv4_h {
    bit<4>      version;
    bit<4>      ihl;
    bit<8>      diffserv;
    bit<16>     total_len;
    bit<16>     identification;
    bit<3>      flags;
    bit<13>     frag_offset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

header udp_h {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

header ina_h {
    bit<8>  version;
    bit<8>  msg_type;
    bit<8>  flags;
    bit<8>  priority;
    bit<16> job;
    bit<16> epoch;
    bit<32> call;
    bit<16> slot;
    bit<8>  rank;
    bit<8>  nlanes;
    bit<32> round;      // low bit selects the slot's shadow copy
    bit<32> length;
    bit<16> block_size;
    bit<16> exponent;   // signed on the wire: compared as int<16>
    bit<32> bitmap;
    bit<64> present;
    bit<64> nonfinite;
}

// One lane's next non-zero block position (wire END = 0xffffffff: none).
header lane_next_h {
    bit<32> pos;
}

// One lane's block of BLOCK_SIZE int32 elements, fields e0 .. e<BLOCK_SIZE-1>.
#define SPINA_BLOCK_FIELD(L, E) bit<32> e##E;
header block_h {
    FOR_EACH_ELEM(SPINA_BLOCK_FIELD, 0)
}

// The same block in narrow lanes (flags FLAG_LANES16, FLAG_LANES8: docs/bits.md).
#define SPINA_BLOCK16_FIELD(L, E) bit<16> e##E;
header block16_h {
    FOR_EACH_ELEM(SPINA_BLOCK16_FIELD, 0)
}
#define SPINA_BLOCK8_FIELD(L, E) bit<8> e##E;
header block8_h {
    FOR_EACH_ELEM(SPINA_BLOCK8_FIELD, 0)
}

struct headers_t {
    ethernet_h          ethernet;
    ipv4_h              ipv4;
    udp_h               udp;
    ina_h               ina;
    lane_next_h[NLANES] lane_next;
    block_h[NLANES]     block;     // at most one of the three stacks is valid: the
    block16_h[NLANES]   block16;   // packet's lane width (flags & FLAGS_LANE_WIDTH)
    block8_h[NLANES]    block8;
}

// What admission hands the aggregator (the `admit` action's parameters).
struct admission_t {
    bool    hit;
    bit<16> epoch;
    bit<16> slot_base;
    bit<16> nslots;
    bit<8>  nworkers;
    bit<16> block_size;
    bit<8>  nlanes;
    bit<16> mcast_grp;
}

// What FabricRoles (v1model/fabric.p4) hands the other controls: the job's level on
// this switch (job_level) and, at a leaf, the spine owning the packet's slot (leaf_upstream).
struct fabric_t {
    bool        leaf;          // as_leaf: this switch aggregates one rack of the job
    bool        spine;         // as_spine: its "workers" are the job's leaves
    bit<8>      rack;          // the rack's index in the job: its rank at the spines
    bit<8>      nlocal;        // the rack's workers (= its admission entries' nworkers),
                               // ranks 0..nlocal-1 on the wire here (rack-local ranks)
    bit<16>     epoch;         // the job's epoch (a spine's packets meet no admission entry)
    bit<16>     mcast_grp;     // the rack's workers
    bool        up;            // leaf_upstream hit: the slot's spine is known
    port_t      up_port;
    mac_addr_t  up_mac;
    ipv4_addr_t up_addr;
    bool        from_spine;    // a result or status for a slot with a leaf_upstream entry
    bit<8>      carried;       // a spine: the partial's MISMATCH | PARTIAL, ORed into its round
    bool        replay;        // a spine: the partial is a leaf's stored result (REPLAY)
}

struct metadata_t {
    admission_t adm;
    fabric_t    fab;
    bool        ina_local;    // an INA packet addressed to this switch (ina_endpoint hit)
    bool        ina_emitted;  // a result/status this switch wrote (counted in egress)
    bool        ipv4_update;  // the IPv4 header changed: recompute its checksum
    bit<32>     owners;       // a reduce-scatter round's owners (its contribution's bitmap;
                              // 0: every copy whole): v1model/scatter_strip.p4
}

#endif
