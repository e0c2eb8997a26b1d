/*
 * api_render.c — responses, SSE events and error bodies in the Anthropic and OpenAI wire
 * shapes (see api.h). Field order follows the real APIs' own output. Every function either
 * appends whole events/bodies or, on failure, leaves the buffer as it was.
 */
#include "api.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "pc_err.h"
#include "pc_json.h"

enum { SSE_INIT = 0, SSE_OPEN = 1, SSE_DONE = 2 };

/* ---- JSON pieces ----------------------------------------------------------------------------- */

/* A tiny writer that remembers the first failure, so a body is composed without checking every
 * append; the caller rolls back to its mark when w.rc != 0. */
typedef struct wr {
    pc_buf_t *b;
    int rc;
} wr_t;

static void w_raw(wr_t *w, const char *s)
{
    if (w->rc == 0)
        w->rc = pc_buf_append_cstr(w->b, s);
}

static void w_str(wr_t *w, const char *s, size_t n)
{
    if (w->rc == 0)
        w->rc = pc_json_string(w->b, s, s != NULL ? n : 0, PC_JSON_UTF8);
}

static void w_cstr(wr_t *w, const char *s)
{
    w_str(w, s, s != NULL ? strlen(s) : 0);
}

static void w_u64(wr_t *w, uint64_t v)
{
    if (w->rc == 0)
        w->rc = pc_buf_printf(w->b, "%" PRIu64, v);
}

static void w_i64(wr_t *w, int64_t v)
{
    if (w->rc == 0)
        w->rc = pc_buf_printf(w->b, "%" PRId64, v);
}

static int w_end(wr_t *w, size_t mark)
{
    if (w->rc != 0) {
        w->b->len = mark;
        return PC_ERR_NOMEM;
    }
    return 0;
}

const char *gw_stop_reason_name(gw_api_kind_t kind, gw_stop_reason_t r)
{
    if (!gw_api_is_anthropic(kind))
        return r == GW_STOP_MAX_TOKENS ? "length" : "stop";
    switch (r) {
    case GW_STOP_MAX_TOKENS:
        return "max_tokens";
    case GW_STOP_STOP_SEQUENCE:
        return "stop_sequence";
    default:
        return "end_turn";
    }
}

/* ---- errors ------------------------------------------------------------------------------------
 */

static void w_error_object(wr_t *w, gw_api_kind_t kind, const gw_api_error_t *e)
{
    if (gw_api_is_anthropic(kind)) {
        w_raw(w, "{\"type\":");
        w_cstr(w, e->type);
        w_raw(w, ",\"message\":");
        w_cstr(w, e->message);
        w_raw(w, "}");
        return;
    }
    w_raw(w, "{\"message\":");
    w_cstr(w, e->message);
    w_raw(w, ",\"type\":");
    w_cstr(w, e->type);
    w_raw(w, ",\"param\":");
    if (e->param[0] != '\0')
        w_cstr(w, e->param);
    else
        w_raw(w, "null");
    w_raw(w, ",\"code\":");
    if (e->code != NULL)
        w_cstr(w, e->code);
    else
        w_raw(w, "null");
    w_raw(w, "}");
}

int gw_api_error_render(gw_api_kind_t kind, const gw_api_error_t *e, const char *request_id,
                        pc_buf_t *b)
{
    wr_t w = {b, 0};
    size_t mark = b->len;
    if (gw_api_is_anthropic(kind)) {
        w_raw(&w, "{\"type\":\"error\",\"error\":");
        w_error_object(&w, kind, e);
        if (request_id != NULL) {
            w_raw(&w, ",\"request_id\":");
            w_cstr(&w, request_id);
        }
        w_raw(&w, "}");
    } else {
        w_raw(&w, "{\"error\":");
        w_error_object(&w, kind, e);
        w_raw(&w, "}");
    }
    return w_end(&w, mark);
}

/* ---- Anthropic
 * ------------------------------------------------------------------------------------ */

/* The usage object. full: the non-streaming / message_start form (with cache_creation and
 * service_tier); else message_delta's cumulative counts. */
static void w_anth_usage(wr_t *w, const gw_usage_t *u, uint32_t output_tokens, bool full)
{
    w_raw(w, "{\"input_tokens\":");
    w_u64(w, u->input_tokens);
    w_raw(w, ",\"cache_creation_input_tokens\":");
    w_u64(w, (uint64_t)u->cache_write_5m + u->cache_write_1h);
    w_raw(w, ",\"cache_read_input_tokens\":");
    w_u64(w, u->cache_read);
    if (full) {
        w_raw(w, ",\"cache_creation\":{\"ephemeral_5m_input_tokens\":");
        w_u64(w, u->cache_write_5m);
        w_raw(w, ",\"ephemeral_1h_input_tokens\":");
        w_u64(w, u->cache_write_1h);
        w_raw(w, "}");
    }
    w_raw(w, ",\"output_tokens\":");
    w_u64(w, output_tokens);
    if (full)
        w_raw(w, ",\"service_tier\":\"standard\"");
    w_raw(w, "}");
}

static void w_stop_fields(wr_t *w, const gw_api_resp_t *r)
{
    w_raw(w, "\"stop_reason\":");
    w_cstr(w, gw_stop_reason_name(GW_API_ANTHROPIC_MESSAGES, r->stop_reason));
    w_raw(w, ",\"stop_sequence\":");
    if (r->stop_reason == GW_STOP_STOP_SEQUENCE)
        w_str(w, r->stop_sequence.base, r->stop_sequence.len);
    else
        w_raw(w, "null");
}

/* {"id":..,"type":"message","role":"assistant","model":..,"content":[ */
static void w_anth_message_head(wr_t *w, const gw_api_resp_t *r)
{
    w_raw(w, "{\"id\":");
    w_cstr(w, r->id);
    w_raw(w, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    w_str(w, r->model.base, r->model.len);
    w_raw(w, ",\"content\":[");
}

int gw_anthropic_message_render(const gw_api_resp_t *r, pc_buf_t *b)
{
    wr_t w = {b, 0};
    size_t mark = b->len;
    w_anth_message_head(&w, r);
    if (!r->prewarm) {
        w_raw(&w, "{\"type\":\"text\",\"text\":");
        w_str(&w, r->text.base, r->text.len);
        w_raw(&w, "}");
    }
    w_raw(&w, "],");
    w_stop_fields(&w, r);
    w_raw(&w, ",\"usage\":");
    w_anth_usage(&w, &r->usage, r->usage.output_tokens, true);
    w_raw(&w, "}");
    return w_end(&w, mark);
}

int gw_anthropic_count_tokens_render(uint32_t input_tokens, pc_buf_t *b)
{
    return pc_buf_printf(b, "{\"input_tokens\":%" PRIu32 "}", input_tokens);
}

void gw_anthropic_sse_init(gw_anthropic_sse_t *s)
{
    s->state = SSE_INIT;
}

int gw_anthropic_sse_start(gw_anthropic_sse_t *s, const gw_api_resp_t *r, pc_buf_t *b)
{
    wr_t w = {b, 0};
    size_t mark = b->len;
    if (s->state != SSE_INIT)
        return PC_ERR_STATE;
    w_raw(&w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":");
    w_anth_message_head(&w, r);
    w_raw(&w, "],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":");
    w_anth_usage(&w, &r->usage, 1, true);
    w_raw(&w, "}}\n\n"
              "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
              "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
              "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    if (w_end(&w, mark) != 0)
        return PC_ERR_NOMEM;
    s->state = SSE_OPEN;
    return 0;
}

int gw_anthropic_sse_text(gw_anthropic_sse_t *s, const char *text, size_t len, pc_buf_t *b)
{
    wr_t w = {b, 0};
    size_t mark = b->len;
    if (s->state != SSE_OPEN)
        return PC_ERR_STATE;
    if (len == 0)
        return 0;
    w_raw(&w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
              "\"delta\":{\"type\":\"text_delta\",\"text\":");
    w_str(&w, text, len);
    w_raw(&w, "}}\n\n");
    return w_end(&w, mark);
}

int gw_anthropic_sse_ping(gw_anthropic_sse_t *s, pc_buf_t *b)
{
    if (s->state != SSE_OPEN)
        return PC_ERR_STATE;
    return pc_buf_append_cstr(b, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

int gw_anthropic_sse_finish(gw_anthropic_sse_t *s, const gw_api_resp_t *r, pc_buf_t *b)
{
    wr_t w = {b, 0};
    size_t mark = b->len;
    if (s->state != SSE_OPEN)
        return PC_ERR_STATE;
    w_raw(&w, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
              "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{");
    w_stop_fields(&w, r);
    w_raw(&w, "},\"usage\":");
    w_anth_usage(&w, &r->usage, r->usage.output_tokens, false);
    w_raw(&w, "}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    if (w_end(&w, mark) != 0)
        return PC_ERR_NOMEM;
    s->state = SSE_DONE;
    return 0;
}

/* The error event that ends a stream of either API: head, the error object, "}\n\n". */
static int sse_error_event(int *state, const char *head, gw_api_kind_t kind,
                           const gw_api_error_t *e, pc_buf_t *b)
{
    wr_t w = {b, 0};
    size_t mark = b->len;
    if (*state != SSE_OPEN)
        return PC_ERR_STATE;
    w_raw(&w, head);
    w_error_object(&w, kind, e);
    w_raw(&w, "}\n\n");
    if (w_end(&w, mark) != 0)
        return PC_ERR_NOMEM;
    *state = SSE_DONE;
    return 0;
}

int gw_anthropic_sse_error(gw_anthropic_sse_t *s, const gw_api_error_t *e, pc_buf_t *b)
{
    return sse_error_event(&s->state, "event: error\ndata: {\"type\":\"error\",\"error\":",
                           GW_API_ANTHROPIC_MESSAGES, e, b);
}

/* ---- OpenAI ------------------------------------------------------------------------------------
 */

static void w_oai_usage(wr_t *w, const gw_usage_t *u)
{
    uint64_t prompt =
        (uint64_t)u->input_tokens + u->cache_read + u->cache_write_5m + u->cache_write_1h;
    w_raw(w, "{\"prompt_tokens\":");
    w_u64(w, prompt);
    w_raw(w, ",\"completion_tokens\":");
    w_u64(w, u->output_tokens);
    w_raw(w, ",\"total_tokens\":");
    w_u64(w, prompt + u->output_tokens);
    w_raw(w, ",\"prompt_tokens_details\":{\"cached_tokens\":");
    w_u64(w, u->cache_read);
    w_raw(w, ",\"audio_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0,"
             "\"audio_tokens\":0,\"accepted_prediction_tokens\":0,"
             "\"rejected_prediction_tokens\":0}}");
}

/* {"id":..,"object":OBJ,"created":..,"model":.. */
static void w_oai_head(wr_t *w, const gw_api_resp_t *r, const char *object)
{
    w_raw(w, "{\"id\":");
    w_cstr(w, r->id);
    w_raw(w, ",\"object\":\"");
    w_raw(w, object);
    w_raw(w, "\",\"created\":");
    w_i64(w, r->created);
    w_raw(w, ",\"model\":");
    w_str(w, r->model.base, r->model.len);
}

int gw_openai_completion_render(const gw_api_resp_t *r, pc_buf_t *b)
{
    wr_t w = {b, 0};
    size_t mark = b->len;
    w_oai_head(&w, r, "chat.completion");
    w_raw(&w, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    w_str(&w, r->text.base, r->text.len);
    w_raw(&w, ",\"refusal\":null},\"logprobs\":null,\"finish_reason\":");
    w_cstr(&w, gw_stop_reason_name(GW_API_OPENAI_CHAT, r->stop_reason));
    w_raw(&w, "}],\"usage\":");
    w_oai_usage(&w, &r->usage);
    w_raw(&w, ",\"system_fingerprint\":null}");
    return w_end(&w, mark);
}

void gw_openai_sse_init(gw_openai_sse_t *s, bool include_usage)
{
    s->state = SSE_INIT;
    s->include_usage = include_usage;
}

/* data: {head,"system_fingerprint":null,"choices":[{"index":0,"delta":DELTA,"logprobs":null,
 * "finish_reason":FR}](,"usage":null)}\n\n — DELTA is written by the caller between the two
 * halves. */
static void w_chunk_open(wr_t *w, const gw_api_resp_t *r)
{
    w_raw(w, "data: ");
    w_oai_head(w, r, "chat.completion.chunk");
    w_raw(w, ",\"system_fingerprint\":null,\"choices\":[{\"index\":0,\"delta\":");
}

static void w_chunk_close(wr_t *w, const gw_openai_sse_t *s, const char *finish_reason)
{
    w_raw(w, ",\"logprobs\":null,\"finish_reason\":");
    if (finish_reason != NULL)
        w_cstr(w, finish_reason);
    else
        w_raw(w, "null");
    w_raw(w, "}]");
    if (s->include_usage)
        w_raw(w, ",\"usage\":null");
    w_raw(w, "}\n\n");
}

/* Opens a chunk and writes delta, the start of its delta, when s is in state want: 0 or
 * PC_ERR_STATE (nothing written). */
static int sse_chunk_begin(const gw_openai_sse_t *s, int want, wr_t *w, const gw_api_resp_t *r,
                           const char *delta)
{
    if (s->state != want)
        return PC_ERR_STATE;
    w_chunk_open(w, r);
    w_raw(w, delta);
    return 0;
}

int gw_openai_sse_start(gw_openai_sse_t *s, const gw_api_resp_t *r, pc_buf_t *b)
{
    wr_t w = {b, 0};
    size_t mark = b->len;
    int rc = sse_chunk_begin(s, SSE_INIT, &w, r,
                             "{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}");
    if (rc != 0)
        return rc;
    w_chunk_close(&w, s, NULL);
    if (w_end(&w, mark) != 0)
        return PC_ERR_NOMEM;
    s->state = SSE_OPEN;
    return 0;
}

int gw_openai_sse_text(gw_openai_sse_t *s, const gw_api_resp_t *r, const char *text, size_t len,
                       pc_buf_t *b)
{
    wr_t w = {b, 0};
    size_t mark = b->len;
    if (len == 0 && s->state == SSE_OPEN)
        return 0;
    int rc = sse_chunk_begin(s, SSE_OPEN, &w, r, "{\"content\":");
    if (rc != 0)
        return rc;
    w_str(&w, text, len);
    w_raw(&w, "}");
    w_chunk_close(&w, s, NULL);
    return w_end(&w, mark);
}

int gw_openai_sse_finish(gw_openai_sse_t *s, const gw_api_resp_t *r, pc_buf_t *b)
{
    wr_t w = {b, 0};
    size_t mark = b->len;
    int rc = sse_chunk_begin(s, SSE_OPEN, &w, r, "{}");
    if (rc != 0)
        return rc;
    w_chunk_close(&w, s, gw_stop_reason_name(GW_API_OPENAI_CHAT, r->stop_reason));
    if (s->include_usage) {
        w_raw(&w, "data: ");
        w_oai_head(&w, r, "chat.completion.chunk");
        w_raw(&w, ",\"system_fingerprint\":null,\"choices\":[],\"usage\":");
        w_oai_usage(&w, &r->usage);
        w_raw(&w, "}\n\n");
    }
    w_raw(&w, "data: [DONE]\n\n");
    if (w_end(&w, mark) != 0)
        return PC_ERR_NOMEM;
    s->state = SSE_DONE;
    return 0;
}

int gw_openai_sse_error(gw_openai_sse_t *s, const gw_api_error_t *e, pc_buf_t *b)
{
    return sse_error_event(&s->state, "data: {\"error\":", GW_API_OPENAI_CHAT, e, b);
}
