/* tofino/spina_t2na_roles.p4 (Tofino 2: the roles and the hold) for P4Testgen only: every path
 * is a first pass of an admitted contribution of a flat job (job_level misses: no leaf or spine
 * role) in its slot range, of this epoch or a stale one, so that the tests exercise the hold
 * and the flat program through this profile and can be replayed on tests/tna_pass.py with the
 * hold (tofino/testgen/README.md; without the harvest assumption P4Testgen's greedy search spent
 * its tests on a reply's later passes, which reach no register of the hold). Not a program for
 * bf-p4c.
 */
#include <testgen.p4>

#define SPINA_TESTGEN_ASSUME                                   \
    testgen_assume(meta.gate == GATE_AGGREGATE                 \
                   || meta.gate == GATE_STALE_EPOCH);          \
    testgen_assume(meta.slot_room != 0);                       \
    testgen_assume(!meta.fab.leaf && !meta.fab.spine);         \
    testgen_assume(!meta.harvest);

#include "../spina_t2na_roles.p4"
