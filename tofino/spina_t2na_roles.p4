/* SpINA for Tofino 2 (T2NA, bf-p4c --target tofino2 --arch t2na), the fabric roles' profile:
 * tofino/spina_tna_roles.p4 (the leaf and spine roles, include/fabric.p4 and
 * include/profile_roles.p4) on Tofino 2's 20 stages, a measurement of whether the roles fit
 * there (tofino/README.md, "Tofino 2": 14 of 20 stages). The controls are the Tofino 1
 * program's, unchanged: only the architecture and the recirculation port differ.
 * Build by hand: bf-p4c --target tofino2 --arch t2na -o DIR tofino/spina_t2na_roles.p4.
 */
#include <core.p4>
#include <t2na.p4>

// Tofino 2's recirculation port in each pipe: local port 6 (ports 0-7 of a pipe are its
// internal ones; the pipe is port[8:7] as on Tofino 1).
#define RECIRC_PORT 6

#include "../p4src/shared/define.p4"
#include "include/define_tna.p4"
#include "size.p4"
#include "../p4src/shared/header.p4"
#include "include/profile_roles.p4"  // the roles' hooks and metadata
#include "include/hold.p4"  // the hold of a newer round
#include "include/types.p4"
#include "include/parser.p4"
#include "include/ina_check.p4"
#include "include/admission.p4"
#include "include/pairs.p4"
#include "include/priority.p4"
#include "include/fabric.p4"
#include "include/slot_index.p4"
#include "include/aggregator.p4"
#include "include/egress_slots.p4"
#include "include/forwarding.p4"
#include "include/egress_rewrite.p4"
#include "include/pipe.p4"
