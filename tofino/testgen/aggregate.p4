/* tofino/spina_tna.p4 for P4Testgen only: every path reaches the Aggregator (a first pass of an
 * admitted contribution in its slot range, or a reply's second or third pass back from the
 * recirculation port), so that P4Testgen's search spends its tests on the slot registers,
 * decide, the pairs and the passes (tofino/testgen/README.md). Not a program for bf-p4c.
 */
#include <testgen.p4>

#define SPINA_TESTGEN_ASSUME                                   \
    testgen_assume(meta.gate == GATE_AGGREGATE                 \
                   || meta.gate == GATE_STALE_EPOCH);          \
    testgen_assume(meta.slot_room != 0);

#include "../spina_tna.p4"
