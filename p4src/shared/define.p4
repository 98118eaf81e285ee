/* SpINA: constants and types shared by every target.
 *
 * Names follow p4src/README.md: types end in _t, constants are UPPER_SNAKE. The values mirror
 * spina/wire.py (message types, flag bits) and spina/spec.py (protocol numbers, INA port);
 * tests/test_p4_agreement.py checks them.
 *
 * No architecture widths here: each target's define file types its ports and queue depths
 * (p4src/v1model/define_v1model.p4, tofino/include/define_tna.p4).
 */
#ifndef SPINA_DEFINE_P4
#define SPINA_DEFINE_P4

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_UDP = 17;
// INA packets are recognised by this UDP destination port (wire.DEFAULT_UDP_PORT). A constant
// rather than a parser value set: BMv2's P4Runtime support for value sets is partial.
const bit<16> INA_UDP_PORT = 47000;

const bit<8> INA_VERSION = 1;
const bit<8> MSG_CONTRIB = 1;
const bit<8> MSG_RESULT = 2;
const bit<8> MSG_STATUS = 3;
// All-gather (docs/protocol.md): replicated unchanged to the job's other workers, no state.
const bit<8> MSG_GATHER = 4;

const bit<8> FLAG_RESEND = 0x01;
const bit<8> FLAG_LOSS_TOLERANT = 0x02;
const bit<8> FLAG_LAST = 0x04;
const bit<8> FLAG_PARTIAL = 0x08;
const bit<8> FLAG_MISMATCH = 0x10;
const bit<8> FLAG_REPLAY = 0x20;
// Narrow lanes (docs/bits.md): the data rows hold int16 or int8 values; both bits: malformed.
const bit<8> FLAG_LANES16 = 0x40;
const bit<8> FLAG_LANES8 = 0x80;
const bit<8> FLAGS_LANE_WIDTH = 0xc0;  // FLAG_LANES16 | FLAG_LANES8

// Two-level aggregation (v1model/fabric.p4): what a rack's partial carries up besides
// LAST (a mismatch or a flush in one rack concerns every rack), and a stored result's flags.
const bit<8> FLAGS_CARRIED = 0x18;  // FLAG_MISMATCH | FLAG_PARTIAL
const bit<8> FLAGS_RESULT = 0x1c;   // FLAG_LAST | FLAGS_CARRIED

const bit<8> WIRE_MAX_LANES = 64;   // present/nonfinite are 64-bit lane bitmaps
const bit<8> WIRE_MAX_WORKERS = 32; // bitmap is a 32-bit rank bitmap

const bit<16> ETH_HDR_BYTES = 14;
const bit<16> IPV4_HDR_BYTES = 20;  // no options: the parser only takes ihl == 5 further
const bit<16> UDP_HDR_BYTES = 8;
const bit<16> INA_HDR_BYTES = 48;   // wire.HEADER_LEN

// cpp helpers: stringify after expansion, so that generated instances get global @names.
#define SPINA_STR(x) #x
#define SPINA_XSTR(x) SPINA_STR(x)

// The congestion drop's loss budget (priority.p4; spina/spec.py LOSS_*): a job's bound is
// `bound` / LOSS_CREDIT_ONE packets lost per packet seen; credit saturates at LOSS_BURST
// packets, so a quiet spell buys at most that many drops beyond the bound.
typedef bit<16> loss_bound_t;
typedef bit<32> loss_credit_t;
const loss_credit_t LOSS_CREDIT_ONE = 0x10000;
const loss_credit_t LOSS_CREDIT_MAX = 0x40000; // LOSS_BURST (4) x LOSS_CREDIT_ONE

#endif
