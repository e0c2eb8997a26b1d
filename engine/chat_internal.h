/*
 * chat_internal.h — engine-internal helpers of chat.c shared with render.c and the tests.
 */
#ifndef ENG_CHAT_INTERNAL_H
#define ENG_CHAT_INTERNAL_H

#include "chat.h"

/* A jansson value written as JSON text (appended to b).
 * Styles: COMPACT has no spaces; PY is Python's json.dumps default (", " and ": "), which is
 * what chat templates' tojson produces; PY_INDENT4 is json.dumps(indent=4). Object keys keep
 * their order; strings are escaped as json.dumps(ensure_ascii=False) does; reals use Python's
 * shortest round-trip repr. Return 0 or PC_ERR_NOMEM (b may hold a partial write). */
enum eng__json_style { ENG__JSON_COMPACT = 0, ENG__JSON_PY = 1, ENG__JSON_PY_INDENT4 = 2 };
int eng__json_write(pc_buf_t *b, const struct json_t *v, enum eng__json_style style);

#endif
