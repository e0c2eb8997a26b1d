/*
 * cacheplan.c — breakpoints, lookback positions, Anthropic's A/B/C usage split and the
 * 20-block lookback walk (see cacheplan.h).
 */
#include "cacheplan.h"
#include "api_internal.h"

#include <string.h>

#include "pc_err.h"

long gw_cacheplan_auto_mark(const eng_chat_t *chat)
{
    size_t n = chat->n_tools + chat->n_system + eng_chat_n_blocks(chat);
    return n > 0 ? (long)n - 1 : -1;
}

/* The kind of a message block for position grouping: 0 = other, 1 = tool_use, 2 =
 * tool_result (tools and system blocks are 0). */
static int block_run_kind(const eng_chat_block_t *b)
{
    return b->kind == ENG_CHAT_BLOCK_TOOL_USE ? 1 : b->kind == ENG_CHAT_BLOCK_TOOL_RESULT ? 2 : 0;
}

/* Adds (or merges) a breakpoint candidate; cands are kept in mark order. */
static void add_bp(gw_cache_bp_t *cands, size_t *n, uint32_t mark, uint32_t n_tokens,
                   eng_chat_ttl_t ttl, bool automatic)
{
    if (*n > 0 && cands[*n - 1].n_tokens == n_tokens) {
        gw_cache_bp_t *last = &cands[*n - 1];
        if (ttl > last->ttl)
            last->ttl = ttl; /* ENG_CHAT_TTL_1H > ENG_CHAT_TTL_5M */
        last->automatic = last->automatic && automatic;
        last->mark = mark;
        return;
    }
    cands[(*n)++] = (gw_cache_bp_t){n_tokens, ttl, mark, automatic};
}

int gw_cacheplan_build(const eng_chat_t *chat, const eng_render_out_t *r, uint32_t min_tokens,
                       eng_chat_ttl_t openai_auto_ttl, pc_arena_t *a, gw_cacheplan_t *out)
{
    size_t n_marks = r->n_marks;
    memset(out, 0, sizeof *out);
    if (n_marks != chat->n_tools + chat->n_system + eng_chat_n_blocks(chat) ||
        (r->tokens == NULL && r->n_tokens > 0) || r->n_tokens > UINT32_MAX)
        return PC_ERR_INVAL;
    out->n_prompt = (uint32_t)r->n_tokens;
    out->n_marks = n_marks;
    if (n_marks == 0)
        return 0;

    uint32_t *ends = pc_arena_new(a, uint32_t, n_marks);
    out->mark_pos = pc_arena_new(a, uint32_t, n_marks);
    out->pos_first = pc_arena_new(a, uint32_t, n_marks);
    out->pos_last = pc_arena_new(a, uint32_t, n_marks);
    gw_cache_bp_t *cands = pc_arena_new(a, gw_cache_bp_t, n_marks);
    if (ends == NULL || out->mark_pos == NULL || out->pos_first == NULL || out->pos_last == NULL ||
        cands == NULL)
        return PC_ERR_NOMEM;
    for (size_t k = 0; k < n_marks; k++) {
        ends[k] = r->marks[k].token_end;
        if (ends[k] > r->n_tokens || (k > 0 && ends[k] < ends[k - 1]))
            return PC_ERR_INVAL;
    }
    out->mark_end = ends;

    /* Positions: runs of tool_use (or tool_result) elements are one position each. The
     * message cursor (mi, bi) walks the blocks alongside k: linear in the elements. */
    int prev_kind = -1;
    size_t mi = 0, bi = 0, n_head = chat->n_tools + chat->n_system;
    for (size_t k = 0; k < n_marks; k++) {
        int kind = 0;
        gw__work++;
        if (k >= n_head) {
            while (bi >= chat->messages[mi].n_blocks) { /* k < n_marks: a block is left */
                gw__work++;
                mi++;
                bi = 0;
            }
            kind = block_run_kind(&chat->messages[mi].blocks[bi++]);
        }
        if (kind != 0 && kind == prev_kind) {
            out->pos_last[out->n_pos - 1] = (uint32_t)k;
        } else {
            out->pos_first[out->n_pos] = out->pos_last[out->n_pos] = (uint32_t)k;
            out->n_pos++;
        }
        out->mark_pos[k] = (uint32_t)(out->n_pos - 1);
        prev_kind = kind;
    }

    /* Breakpoint candidates in mark order. */
    size_t n_cands = 0;
    if (chat->api == ENG_CHAT_API_OPENAI) {
        if (openai_auto_ttl != ENG_CHAT_TTL_NONE) {
            size_t k = chat->n_tools, m_first = chat->n_messages, n_ends = 0;
            if (chat->n_system > 0) {
                k += chat->n_system;
                add_bp(cands, &n_cands, (uint32_t)(k - 1), ends[k - 1], openai_auto_ttl, true);
            }
            /* Only the last GW_CACHEPLAN_OPENAI_AUTO_MAX message ends (see cacheplan.h). */
            while (m_first > 0 && n_ends < GW_CACHEPLAN_OPENAI_AUTO_MAX) {
                gw__work++;
                n_ends += chat->messages[--m_first].n_blocks > 0;
            }
            for (size_t m = 0; m < chat->n_messages; m++) {
                gw__work++;
                k += chat->messages[m].n_blocks;
                if (chat->messages[m].n_blocks == 0)
                    continue;
                if (m < m_first)
                    out->n_auto_capped++;
                else
                    add_bp(cands, &n_cands, (uint32_t)(k - 1), ends[k - 1], openai_auto_ttl, true);
            }
        }
    } else {
        long auto_k = gw_cacheplan_auto_mark(chat);
        for (size_t k = 0; k < n_marks; k++) {
            eng_chat_ttl_t ttl = r->marks[k].ttl;
            bool automatic = false;
            if ((long)k == auto_k && chat->auto_cache_ttl != ENG_CHAT_TTL_NONE &&
                ttl == ENG_CHAT_TTL_NONE) {
                ttl = chat->auto_cache_ttl;
                automatic = true;
            }
            if (ttl != ENG_CHAT_TTL_NONE)
                add_bp(cands, &n_cands, (uint32_t)k, ends[k], ttl, automatic);
        }
    }

    /* Only prefixes of at least min_tokens are written. */
    out->bps = cands;
    for (size_t i = 0; i < n_cands; i++) {
        if (cands[i].n_tokens < min_tokens || cands[i].n_tokens == 0)
            out->n_below_min++;
        else
            out->bps[out->n_bps++] = cands[i];
    }
    return 0;
}

void gw_usage_compute(const gw_cacheplan_t *p, uint32_t n_prompt, uint32_t read_tokens,
                      gw_usage_t *u)
{
    uint32_t A = read_tokens < n_prompt ? read_tokens : n_prompt, B = A, C = A;
    for (size_t i = 0; i < p->n_bps; i++) {
        uint32_t t = p->bps[i].n_tokens < n_prompt ? p->bps[i].n_tokens : n_prompt;
        if (t > A && p->bps[i].ttl == ENG_CHAT_TTL_1H && t > B)
            B = t;
        if (t > C)
            C = t;
    }
    u->cache_read = A;
    u->cache_write_1h = B - A;
    u->cache_write_5m = C - B;
    u->input_tokens = n_prompt - C;
    u->output_tokens = 0;
}

uint32_t gw_cacheplan_anthropic_hit(const gw_cacheplan_t *p,
                                    bool (*entry_live)(uint32_t n_tokens, void *ud), void *ud)
{
    uint32_t best = 0;
    for (size_t i = 0; i < p->n_bps; i++) {
        const gw_cache_bp_t *bp = &p->bps[i];
        size_t pos = p->mark_pos[bp->mark];
        bool hit = false;
        for (size_t step = 0; step < GW_CACHEPLAN_LOOKBACK && !hit; step++, pos--) {
            /* Every mark end of the position, from its last mark down (the breakpoint's own
             * position starts at the breakpoint). */
            long k = step == 0 ? (long)bp->mark : (long)p->pos_last[pos];
            for (; k >= (long)p->pos_first[pos]; k--) {
                uint32_t n = p->mark_end[k];
                if (n > 0 && n <= best) {
                    hit = true; /* further back is shorter still: no improvement */
                    break;
                }
                if (n > 0 && (k == (long)bp->mark || n != p->mark_end[k + 1]) &&
                    entry_live(n, ud)) {
                    best = n;
                    hit = true;
                    break;
                }
            }
            if (pos == 0)
                break;
        }
    }
    return best;
}

typedef struct sorted_set {
    const uint32_t *v;
    size_t n;
} sorted_set_t;

static bool in_sorted(uint32_t n_tokens, void *ud)
{
    const sorted_set_t *set = ud;
    size_t lo = 0, hi = set->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (set->v[mid] < n_tokens)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < set->n && set->v[lo] == n_tokens;
}

uint32_t gw_cacheplan_anthropic_hit_sorted(const gw_cacheplan_t *p, const uint32_t *live,
                                           size_t n_live)
{
    sorted_set_t set = {live, n_live};
    return gw_cacheplan_anthropic_hit(p, in_sorted, &set);
}
