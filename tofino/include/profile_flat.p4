/* SpINA on Tofino 1, the default profile (tofino/spina_tna.p4): flat jobs, no fabric roles.
 * The hooks the shared controls expand where the roles' profile (include/profile_roles.p4,
 * tofino/spina_tna_roles.p4) adds or replaces something, grouped by the file that expands
 * them: here each is empty, or its argument FLAT (the default program's own statements,
 * written at the hook), and the tables' sizes are the default's. Both profile files define
 * the same names (tests/test_tna_agreement.py).
 */
#ifndef SPINA_TNA_PROFILE_FLAT_P4
#define SPINA_TNA_PROFILE_FLAT_P4

// types.p4
#define SPINA_ROLE_INGRESS_MD

// ina_check.p4
#define SPINA_ROLE_WELL_FORMED
#define INA_CHECK_ENTRIES 2

// admission.p4
#define SPINA_GATE_ANY
#define GATE_ENTRIES 4
#define SPINA_ROLE_GATE_KEYS
#define SPINA_ROLE_GATE_ENTRIES

// slot_index.p4
#define SPINA_ROLE_SLOT_INDEX
#define SPINA_ROLE_SLOT_INDEX_APPLY

// aggregator.p4
#define SPINA_ROLE_ROUND_ACTIONS
#define SPINA_ROLE_COUNT_ACTIONS
#define SPINA_ROLE_BITMAP_INPUT(FLAT) FLAT
#define SPINA_ROLE_REPLY_ACTIONS
#define SPINA_ROLE_ROUND_CHECK(FLAT) FLAT
#define SPINA_ROLE_REPLAY_FIRST
#define SPINA_ROLE_STORE
#define SPINA_ROLE_OR_DUP
#define SPINA_ROLE_DROP
#define SPINA_ROLE_RESULT_HEADER(FLAT) FLAT
#define SPINA_ROLE_REPLY(FLAT) FLAT

// decide.p4
#define SPINA_ROLE_DECIDE_ACTIONS
#define SPINA_ROLE_ACTIONS
#define SPINA_ROLE_ANY
#define SPINA_ROLE_ENTRIES
#define DECIDE_ENTRIES 16
#define SPINA_ROLE_DECIDE_KEYS
#define SPINA_CARRY_ANY
#define SPINA_CARRIED_FLAG_ENTRIES
#define FLAG_INPUT_ENTRIES 8
#define SPINA_ROLE_FLAG_INPUT_KEYS

// pipe.p4
#define SPINA_ROLE_INGRESS_CONTROLS
#define SPINA_ROLE_INGRESS_FIRST

#endif
