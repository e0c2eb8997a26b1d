/* common.h — the one header of common/: the basics every kvgw module shares. */
#ifndef PC_COMMON_H
#define PC_COMMON_H

#include "pc_alloc.h"
#include "pc_arena.h"
#include "pc_assert.h"
#include "pc_buf.h"
#include "pc_err.h"
#include "pc_heap.h"
#include "pc_json.h"
#include "pc_log.h"
#include "pc_pages.h"
#include "pc_rss.h"
#include "pc_strmap.h"
#include "pc_time.h"
#include "pc_u64map.h"
#include "pc_utf8.h"
#include "pc_vec.h"

#endif
