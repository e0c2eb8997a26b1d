/*
 * cacheplan.h — where a request writes cache entries, how its prompt tokens are billed, and
 * Anthropic's block-boundary hits (the 20-block lookback).
 *
 * Input: the request's chat (chat.h) and its rendered, tokenized prompt (render.h), whose marks
 * give the token offset where every tool, system block and content block ends (mark k is the
 * k-th element in tools -> system -> messages order, the order of chat's arrays).
 *
 * Breakpoints. Anthropic: every element with a cache_control TTL, plus the top-level
 * (automatic) one on the last element (all elements kvgw accepts are cacheable; when the last
 * element already carries a breakpoint the automatic one merges into it: same TTL, validated by
 * gw_api_parse). OpenAI (and any chat without cache_control) with openai_auto_ttl != NONE: an
 * automatic breakpoint at the end of the system blocks and at the end of each of the last
 * GW_CACHEPLAN_OPENAI_AUTO_MAX messages (the earlier ones are counted in n_auto_capped). A
 * breakpoint writes one entry: the token prefix [0, n_tokens). Breakpoints whose prefix is
 * shorter than min_tokens are not written (no error; counted in n_below_min). Two breakpoints
 * with the same n_tokens merge, keeping the longer TTL.
 *
 * Positions (for accounting: anthropic). Anthropic's lookback walks back "one block at a time",
 * a run of consecutive tool_use blocks counting as one position and so does a run of
 * consecutive tool_result blocks. Position j covers marks [pos_first[j], pos_last[j]]; an entry
 * may end at any mark of a position.
 *
 * Usage (Anthropic's mixed-TTL rule): A = tokens read (highest hit), B = the highest 1h
 * breakpoint above A (else A), C = the last breakpoint (at least A). read = A, 1h write = B - A,
 * 5m write = C - B, input = n_prompt - C. The four are disjoint and sum to n_prompt.
 *
 * Memory: the plan's arrays live in the arena given to gw_cacheplan_build.
 */
#ifndef GW_CACHEPLAN_H
#define GW_CACHEPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "chat.h"
#include "pc_arena.h"
#include "render.h"

#define GW_CACHEPLAN_LOOKBACK 20 /* positions per breakpoint, the breakpoint's own first */

/* OpenAI automatic caching writes entries at the ends of at most this many messages (the last
 * ones), plus the system prompt: at most GW_CACHEPLAN_MAX_BPS entries per request, whatever its
 * length (one per message was unbounded: a 160k-message body asked the loop for 160k inserts).
 * Why the last 20: the next turn of a conversation extends this prompt and reads its longest
 * entry (the last message); the earlier ends serve a client that goes back and edits or retries
 * an earlier turn, and 20 is Anthropic's lookback (GW_CACHEPLAN_LOOKBACK): a request that drops
 * more than 20 messages of this one would not find them within its own lookback either (with
 * accounting: anthropic), and still reads the system prompt's entry. The bill does not change:
 * writes are billed up to the last breakpoint (usage C), which is kept. */
#define GW_CACHEPLAN_OPENAI_AUTO_MAX 20
/* The most breakpoints a plan has: OpenAI's automatic ones, or Anthropic's 4 explicit ones
 * (the automatic one merges into them or is one of the 4). */
#define GW_CACHEPLAN_MAX_BPS (GW_CACHEPLAN_OPENAI_AUTO_MAX + 1)

typedef struct gw_cache_bp {
    uint32_t n_tokens;  /* the entry is the prompt prefix [0, n_tokens) */
    eng_chat_ttl_t ttl; /* 5M or 1H */
    uint32_t mark;      /* index of the mark (element) it ends at */
    bool automatic;     /* placed by top-level cache_control or OpenAI auto caching only */
} gw_cache_bp_t;

typedef struct gw_cacheplan {
    gw_cache_bp_t *bps; /* [n_bps], written breakpoints, strictly increasing n_tokens */
    size_t n_bps;
    size_t n_below_min;   /* breakpoints skipped: prefix shorter than min_tokens */
    size_t n_auto_capped; /* OpenAI message ends left out by GW_CACHEPLAN_OPENAI_AUTO_MAX */
    uint32_t n_prompt;    /* the prompt's tokens (r->n_tokens) */
    /* Lookback positions, in order: [n_pos] each */
    uint32_t *pos_first, *pos_last; /* mark range of the position */
    size_t n_pos;
    const uint32_t *mark_end; /* [n_marks] token_end of every mark (points into the render) */
    uint32_t *mark_pos;       /* [n_marks] the position of every mark */
    size_t n_marks;
} gw_cacheplan_t;

/* The mark index where a top-level (automatic) Anthropic breakpoint lands: the last element
 * (n_tools + n_system + all blocks - 1), or -1 when the chat has no element. */
long gw_cacheplan_auto_mark(const eng_chat_t *chat);

/* Builds *out (zeroed first). r must be tokenized (r->tokens set) from chat. openai_auto_ttl
 * applies when chat->api is OpenAI (NONE: no automatic entries). Returns 0, PC_ERR_INVAL
 * (r's marks do not match the chat, or r is not tokenized) or PC_ERR_NOMEM. */
int gw_cacheplan_build(const eng_chat_t *chat, const eng_render_out_t *r, uint32_t min_tokens,
                       eng_chat_ttl_t openai_auto_ttl, pc_arena_t *a, gw_cacheplan_t *out);

/* Fills *u's prompt buckets from the plan and read_tokens (A: the prompt tokens covered by a
 * live entry, from the gateway's index; clamped to n_prompt). output_tokens is set to 0. */
void gw_usage_compute(const gw_cacheplan_t *p, uint32_t n_prompt, uint32_t read_tokens,
                      gw_usage_t *u);

/* accounting: anthropic. For each written breakpoint, walks back GW_CACHEPLAN_LOOKBACK
 * positions (the breakpoint's own position first; within a position every mark end from the
 * last down, those above the breakpoint excluded) and asks entry_live(n_tokens, ud) whether a
 * live entry of exactly that prefix exists; the walk stops at its first hit. Returns the
 * highest hit over all walks (A), 0 when none. */
uint32_t gw_cacheplan_anthropic_hit(const gw_cacheplan_t *p,
                                    bool (*entry_live)(uint32_t n_tokens, void *ud), void *ud);

/* gw_cacheplan_anthropic_hit with the live entries given as their lengths, ascending
 * (gw_cindex_path_entries: every live entry that is a prefix of the prompt). The probes cost a
 * binary search each instead of a walk of the index each: a position of 100k tool_result blocks
 * makes 100k probes, which as index walks along a stored 500k-token prompt are O(tokens^2) on
 * the event loop. */
uint32_t gw_cacheplan_anthropic_hit_sorted(const gw_cacheplan_t *p, const uint32_t *live,
                                           size_t n_live);

#endif
