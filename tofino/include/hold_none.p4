/* SpINA on Tofino: the hold's hooks (include/hold.p4), empty, for the profiles without the
 * hold of a newer round (Tofino 1's: it does not fit there, tofino/README.md). Both files
 * define the same names (tests/test_tna_agreement.py).
 */
#ifndef SPINA_TNA_HOLD_NONE_P4
#define SPINA_TNA_HOLD_NONE_P4

// types.p4
#define SPINA_HOLD_INGRESS_MD

// slot_index.p4
#define SPINA_HOLD_SLOT_INDEX
#define SPINA_HOLD_SLOT_INDEX_APPLY

// aggregator.p4
#define SPINA_HOLD_ACTIONS
#define SPINA_HOLD_APPLY

#endif
