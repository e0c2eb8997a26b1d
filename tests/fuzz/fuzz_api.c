/*
 * fuzz_api.c — request body bytes through gw_api_parse as each of the three kinds.
 *
 * Checked on every input, trapping on violation:
 *   - a rejected body gets a 400 (or 500 on memory failure) with a non-empty message and an API
 *     error type, the out pointer is untouched, and the rendered error body is valid JSON;
 *   - an accepted request has a chat with at least one message, sampling parameters the engine
 *     accepts, stop sequences within the limits, and (Anthropic) at most 4 breakpoints counting
 *     the automatic one, none with ttl 1h after one with ttl 5m.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "cacheplan.h"
#include "common.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "fuzz_api: check failed: %s (line %d)\n", #x, __LINE__);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Every element's TTL in order, the automatic one applied to the last element. */
static void check_breakpoints(const eng_chat_t *c)
{
    size_t n = 0, total = c->n_tools + c->n_system + eng_chat_n_blocks(c), k = 0;
    long auto_k = gw_cacheplan_auto_mark(c);
    bool seen_5m = false;
    for (size_t i = 0; i < c->n_tools + c->n_system + c->n_messages; i++) {
        size_t nb =
            i < c->n_tools + c->n_system ? 1 : c->messages[i - c->n_tools - c->n_system].n_blocks;
        for (size_t j = 0; j < nb; j++, k++) {
            eng_chat_ttl_t t = i < c->n_tools ? c->tools[i].cache_ttl
                               : i < c->n_tools + c->n_system
                                   ? c->system[i - c->n_tools].cache_ttl
                                   : c->messages[i - c->n_tools - c->n_system].blocks[j].cache_ttl;
            if ((long)k == auto_k && c->auto_cache_ttl != ENG_CHAT_TTL_NONE) {
                CHECK(t == ENG_CHAT_TTL_NONE || t == c->auto_cache_ttl);
                t = c->auto_cache_ttl;
            }
            n += t != ENG_CHAT_TTL_NONE;
            CHECK(!(t == ENG_CHAT_TTL_1H && seen_5m));
            seen_5m = seen_5m || t == ENG_CHAT_TTL_5M;
        }
    }
    CHECK(k == total);
    CHECK(n <= GW_API_MAX_BREAKPOINTS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const gw_api_kind_t kinds[] = {GW_API_ANTHROPIC_MESSAGES, GW_API_ANTHROPIC_COUNT_TOKENS,
                                          GW_API_OPENAI_CHAT};
    for (size_t i = 0; i < 3; i++) {
        pc_arena_t arena;
        gw_api_req_t *r = (gw_api_req_t *)&arena;
        gw_api_error_t e;
        pc_arena_init(&arena, 0);
        int rc = gw_api_parse(kinds[i], data, size, &arena, &r, &e);
        if (rc != 0) {
            CHECK(rc == PC_ERR_INVAL || rc == PC_ERR_UNSUPPORTED || rc == PC_ERR_NOMEM);
            CHECK(r == (gw_api_req_t *)&arena);
            CHECK(e.message[0] != '\0' && e.type != NULL);
            CHECK(e.status == (rc == PC_ERR_NOMEM ? 500 : 400));
            pc_buf_t b = PC_BUF_INIT;
            CHECK(gw_api_error_render(kinds[i], &e, "req_1", &b) == 0);
            json_t *v = json_loadb(b.base, b.len, 0, NULL);
            CHECK(v != NULL);
            json_decref(v);
            pc_buf_free(&b);
        } else {
            char why[256];
            CHECK(r->kind == kinds[i] && r->chat != NULL && r->chat->n_messages >= 1);
            CHECK(eng_sampling_params_check(&r->sampling, why, sizeof why) == 0);
            CHECK(r->n_stop <= GW_API_MAX_STOP);
            for (size_t k = 0; k < r->n_stop; k++)
                CHECK(r->stop[k].len >= 1 && r->stop[k].len <= GW_API_MAX_STOP_BYTES);
            CHECK(!r->has_cache_salt ||
                  (r->cache_salt.len >= 1 && r->cache_salt.len <= GW_API_MAX_SALT_BYTES));
            if (kinds[i] == GW_API_ANTHROPIC_MESSAGES)
                CHECK(r->has_max_tokens && !(r->max_tokens == 0 && r->stream));
            if (gw_api_is_anthropic(kinds[i]))
                check_breakpoints(r->chat);
            else
                CHECK(r->chat->auto_cache_ttl == ENG_CHAT_TTL_NONE);
        }
        pc_arena_close(&arena);
    }
    return 0;
}
