/* tofino/spina_tna.p4 for P4Testgen only: every path is an INA packet for this switch that is
 * refused (malformed, unadmitted, below or above its job's slot range) or of a stale epoch,
 * so that P4Testgen's search spends its tests on InaCheck, admission and the gate
 * (tofino/testgen/README.md). Not a program for bf-p4c.
 */
#include <testgen.p4>

#define SPINA_TESTGEN_ASSUME                                             \
    testgen_assume(!meta.harvest && meta.gate != GATE_FORWARD);          \
    testgen_assume(meta.gate != GATE_AGGREGATE || meta.slot_room == 0);

#include "../spina_tna.p4"
