/* SpINA for Tofino 1 (TNA), the fabric roles' profile: tofino/spina_tna.p4 with the leaf and
 * spine roles (p4src/v1model/fabric.p4's, at this program's sizes): include/fabric.p4's
 * FabricRoles, and include/profile_roles.p4's additions to the other controls. A measurement
 * of what the roles cost on Tofino 1, which bf-p4c refuses at 64 elements (tofino/README.md,
 * "The hold and the roles on Tofino 1"); the controller deploys the default profile only.
 * Build by hand: bf-p4c --target tofino --arch tna -o DIR tofino/spina_tna_roles.p4.
 */
#include <core.p4>
#include <tna.p4>

#include "../p4src/shared/define.p4"
#include "include/define_tna.p4"
#include "size.p4"
#include "../p4src/shared/header.p4"
#include "include/profile_roles.p4"  // the roles' hooks and metadata
#include "include/hold_none.p4"  // the hold's hooks, empty (it does not fit Tofino 1)
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
