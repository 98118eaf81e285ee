/* SpINA for Tofino 1 (TNA, bf-p4c --target tofino --arch tna), the default profile: flat jobs,
 * no fabric roles (tofino/spina_tna_roles.p4 is the roles' profile). Includes the controls of
 * include/ in order; include/pipe.p4 sequences them. Build: `make tofino` (tofino/README.md).
 *
 * The same wire format and per-packet semantics as p4src/ (softswitch Pipeline.process) for
 * flat jobs at this program's sizes (size.p4: one lane of BLOCK_SIZE int32 per packet).
 */
#include <core.p4>
#include <tna.p4>

#include "../p4src/shared/define.p4"
#include "include/define_tna.p4"
#include "size.p4"
#include "../p4src/shared/header.p4"
#include "include/profile_flat.p4"  // the roles' hooks, empty
#include "include/hold_none.p4"  // the hold's hooks, empty (it does not fit Tofino 1)
#include "include/types.p4"
#include "include/parser.p4"
#include "include/ina_check.p4"
#include "include/admission.p4"
#include "include/pairs.p4"
#include "include/priority.p4"
#include "include/slot_index.p4"
#include "include/aggregator.p4"
#include "include/egress_slots.p4"
#include "include/forwarding.p4"
#include "include/egress_rewrite.p4"
#include "include/pipe.p4"
