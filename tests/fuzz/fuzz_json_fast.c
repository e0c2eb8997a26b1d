/*
 * fuzz_json_fast.c — gateway/json_fast.c against jansson on arbitrary bytes.
 *
 * Checked on every input, trapping on violation: gw_json_loadb and json_loadb (flags
 * JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, then 0) both fail with the same error text and
 * position, or both succeed with trees whose compact dumps are identical; and whatever the fast
 * path accepts on its own, jansson accepts with the same tree; gw_json_loadb_keep (only "a"
 * built) gives jansson's tree with the other top-level values null, or jansson's error.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_fast.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "fuzz_json_fast: check failed: %s (line %d)\n", #x, __LINE__);         \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void same_tree(const json_t *a, const json_t *b)
{
    char *da = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
    char *db = json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY);
    CHECK(json_equal(a, b));
    CHECK(da != NULL && db != NULL && strcmp(da, db) == 0);
    free(da);
    free(db);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t flags[] = {JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, 0};
    const char *s = (const char *)data;
    for (size_t i = 0; i < 2; i++) {
        json_error_t e1, e2;
        json_t *a = json_loadb(s, size, flags[i], &e1);
        json_t *b = gw_json_loadb(s, size, flags[i], &e2);
        json_t *f = gw__json_fast_only(s, size, flags[i]);
        CHECK((a == NULL) == (b == NULL));
        if (a == NULL) {
            CHECK(strcmp(e1.text, e2.text) == 0);
            CHECK(e1.line == e2.line && e1.column == e2.column && e1.position == e2.position);
            CHECK(f == NULL);
        } else {
            same_tree(a, b);
            if (f != NULL)
                same_tree(a, f);
        }
        /* Skipping the top-level values other than "a": jansson's tree with those values null,
         * or jansson's error. */
        static const char *const keep[] = {"a"};
        json_t *k = gw_json_loadb_keep(s, size, flags[i], keep, 1, &e2);
        CHECK((a == NULL) == (k == NULL));
        if (a == NULL) {
            CHECK(strcmp(e1.text, e2.text) == 0 && e1.position == e2.position);
        } else {
            if (json_is_object(a))
                for (void *it = json_object_iter(a); it != NULL; it = json_object_iter_next(a, it))
                    if (strcmp(json_object_iter_key(it), "a") != 0)
                        json_object_iter_set_new(a, it, json_null());
            same_tree(a, k);
        }
        json_decref(k);
        json_decref(a);
        json_decref(b);
        json_decref(f);
    }
    return 0;
}
