/*
 * test_dashboard.c — the /dashboard page (gateway/dashboard.c): a well-formed, self-contained
 * HTML document that names every metric family it reads and no other, and an allocation
 * failure leaves the caller's buffer as it was.
 *
 * With `--write FILE` the binary instead writes the page to FILE (the headless browser test,
 * tests/integration/dashboard.test.mjs, compares it with what GET /dashboard serves).
 */
#include "dashboard.h"

#include <ctype.h>
#include <stdbool.h>

#include "common.h"
#include "pc_test.h"

static pc_buf_t page(void)
{
    pc_buf_t b = PC_BUF_INIT;
    if (gw_dashboard_page(&b) != 0 || pc_buf_terminate(&b) != 0) {
        fprintf(stderr, "gw_dashboard_page failed\n");
        exit(1);
    }
    return b;
}

static bool in_list(const char *name, size_t len)
{
    for (const char *const *m = gw_dashboard_metric_names(); *m; m++)
        if (strlen(*m) == len && memcmp(*m, name, len) == 0)
            return true;
    return false;
}

PC_TEST(page_is_a_complete_document)
{
    pc_buf_t b = page();
    ASSERT_TRUE(b.len > 1000);
    ASSERT_TRUE(strncmp(b.base, "<!doctype html>", 15) == 0);
    ASSERT_TRUE(strstr(b.base, "<meta charset=\"utf-8\">") != NULL);
    const char *end = b.base + b.len;
    while (end > b.base && isspace((unsigned char)end[-1]))
        end--;
    ASSERT_TRUE(end - b.base >= 7 && memcmp(end - 7, "</html>", 7) == 0);
    ASSERT_EQ_U64(strlen(b.base), b.len); /* no NUL inside */
    /* Same bytes on every call, appended after what the buffer already holds. */
    pc_buf_t c = PC_BUF_INIT;
    ASSERT_EQ(pc_buf_append_cstr(&c, "x"), 0);
    ASSERT_EQ(gw_dashboard_page(&c), 0);
    ASSERT_EQ_U64(c.len, b.len + 1);
    ASSERT_MEM_EQ(c.base + 1, b.base, b.len);
    pc_buf_free(&c);
    pc_buf_free(&b);
}

/* Valid UTF-8 throughout (the page is served as charset=utf-8). */
PC_TEST(page_is_utf8)
{
    pc_buf_t b = page();
    const unsigned char *p = (const unsigned char *)b.base, *e = p + b.len;
    while (p < e) {
        int n = *p < 0x80             ? 0
                : (*p & 0xe0) == 0xc0 ? 1
                : (*p & 0xf0) == 0xe0 ? 2
                : (*p & 0xf8) == 0xf0 ? 3
                                      : -1;
        ASSERT_TRUE(n >= 0);
        ASSERT_TRUE(p + n < e);
        for (int i = 1; i <= n; i++)
            ASSERT_EQ((p[i] & 0xc0), 0x80);
        p += n + 1;
    }
    pc_buf_free(&b);
}

/* Elements nest and close: a stack of open tags over the markup, with script and style bodies
 * skipped as raw text, comments and the doctype ignored, and void elements never pushed. */
PC_TEST(page_tags_balance)
{
    static const char *const void_tags[] = {"meta", "br", "img", "input", "link", "hr"};
    pc_buf_t b = page();
    char stack[64][16];
    int depth = 0, n_canvas = 0, n_script = 0;
    const char *p = b.base, *e = b.base + b.len;
    while ((p = memchr(p, '<', (size_t)(e - p))) != NULL) {
        if (strncmp(p, "<!--", 4) == 0) {
            const char *q = strstr(p, "-->");
            ASSERT_TRUE(q != NULL);
            p = q + 3;
            continue;
        }
        if (p[1] == '!') { /* doctype */
            p = strchr(p, '>');
            ASSERT_TRUE(p != NULL);
            continue;
        }
        bool closing = p[1] == '/';
        const char *n = p + 1 + closing;
        size_t len = 0;
        while (isalnum((unsigned char)n[len]))
            len++;
        ASSERT_TRUE(len > 0 && len < 16);
        const char *gt = strchr(n, '>');
        ASSERT_TRUE(gt != NULL);
        char tag[16];
        memcpy(tag, n, len);
        tag[len] = '\0';
        if (closing) {
            ASSERT_TRUE(depth > 0);
            depth--;
            ASSERT_STR_EQ(stack[depth], tag);
            p = gt + 1;
            continue;
        }
        bool is_void = gt[-1] == '/';
        for (size_t i = 0; i < PC_ARRAY_LEN(void_tags); i++)
            is_void = is_void || strcmp(tag, void_tags[i]) == 0;
        n_canvas += strcmp(tag, "canvas") == 0;
        p = gt + 1;
        if (is_void)
            continue;
        ASSERT_TRUE(depth < 64);
        snprintf(stack[depth++], sizeof stack[0], "%s", tag);
        if (strcmp(tag, "script") == 0 || strcmp(tag, "style") == 0) {
            char close[24];
            snprintf(close, sizeof close, "</%s>", tag);
            const char *q = strstr(p, close);
            ASSERT_TRUE(q != NULL);
            n_script += strcmp(tag, "script") == 0;
            p = q; /* the closing tag pops it */
        }
    }
    ASSERT_EQ(depth, 0);
    ASSERT_EQ(n_script, 1);
    ASSERT_TRUE(n_canvas >= 6);
    pc_buf_free(&b);
}

/* Nothing is fetched from elsewhere: no external script, style, font or image. */
PC_TEST(page_is_self_contained)
{
    pc_buf_t b = page();
    ASSERT_TRUE(strstr(b.base, "http://") == NULL);
    ASSERT_TRUE(strstr(b.base, "https://") == NULL);
    ASSERT_TRUE(strstr(b.base, "<script src") == NULL);
    ASSERT_TRUE(strstr(b.base, "<link") == NULL);
    ASSERT_TRUE(strstr(b.base, "@import") == NULL);
    ASSERT_TRUE(strstr(b.base, "url(") == NULL);
    /* It polls /metrics with the admin key as a bearer token, taken from the fragment or asked
     * for in a form, and kept in sessionStorage (never localStorage: gone with the tab). */
    ASSERT_TRUE(strstr(b.base, "\"metrics\"") != NULL);
    ASSERT_TRUE(strstr(b.base, "key=") != NULL);
    ASSERT_TRUE(strstr(b.base, "\"Bearer \" + key") != NULL);
    ASSERT_TRUE(strstr(b.base, "<form id=\"keyform\"") != NULL);
    ASSERT_TRUE(strstr(b.base, "sessionStorage.setItem") != NULL);
    ASSERT_TRUE(strstr(b.base, "localStorage") == NULL);
    ASSERT_TRUE(strstr(b.base, "setInterval(scrape, INTERVAL_MS)") != NULL);
    ASSERT_TRUE(strstr(b.base, "INTERVAL_MS = 2000") != NULL);
    pc_buf_free(&b);
}

/* Every family the page reads is in gw_dashboard_metric_names, and every listed family is
 * read by the script (a quoted name inside <script>). */
PC_TEST(page_names_exactly_its_metrics)
{
    pc_buf_t b = page();
    const char *script = strstr(b.base, "<script>");
    ASSERT_TRUE(script != NULL);
    size_t n_listed = 0;
    for (const char *const *m = gw_dashboard_metric_names(); *m; m++, n_listed++) {
        char quoted[96];
        snprintf(quoted, sizeof quoted, "\"%s", *m);
        if (strstr(script, quoted) == NULL)
            fprintf(stderr, "the script does not read %s\n", *m);
        ASSERT_TRUE(strstr(script, quoted) != NULL);
    }
    ASSERT_EQ_U64(n_listed, 30);
    size_t seen = 0;
    for (const char *p = b.base; (p = strstr(p, "kvgw_")) != NULL;) {
        size_t len = 0;
        while (islower((unsigned char)p[len]) || isdigit((unsigned char)p[len]) || p[len] == '_')
            len++;
        /* Histogram series carry a suffix; the page builds them from the family name. */
        static const char *const suffixes[] = {"_bucket", "_count", "_sum"};
        size_t base_len = len;
        for (size_t i = 0; i < PC_ARRAY_LEN(suffixes); i++) {
            size_t sl = strlen(suffixes[i]);
            if (len > sl && memcmp(p + len - sl, suffixes[i], sl) == 0 && in_list(p, len - sl))
                base_len = len - sl;
        }
        if (!in_list(p, base_len))
            fprintf(stderr, "the page names %.*s, which is not in gw_dashboard_metric_names\n",
                    (int)len, p);
        ASSERT_TRUE(in_list(p, base_len));
        seen++;
        p += len;
    }
    ASSERT_TRUE(seen >= n_listed);
    pc_buf_free(&b);
}

static int fail_alloc;
static void *failing_malloc(size_t n)
{
    return fail_alloc ? NULL : malloc(n);
}
static void *failing_calloc(size_t c, size_t n)
{
    return fail_alloc ? NULL : calloc(c, n);
}
static void *failing_realloc(void *p, size_t n)
{
    return fail_alloc ? NULL : realloc(p, n);
}

PC_TEST(allocation_failure_leaves_buffer)
{
    pc_allocator_t a = {failing_malloc, failing_calloc, failing_realloc, free};
    pc_allocator_t prev = pc_set_allocator(&a);
    pc_buf_t b = PC_BUF_INIT;
    ASSERT_EQ(pc_buf_append_cstr(&b, "before"), 0);
    fail_alloc = 1;
    int rc = gw_dashboard_page(&b);
    fail_alloc = 0;
    ASSERT_EQ(rc, PC_ERR_NOMEM);
    ASSERT_EQ_U64(b.len, 6);
    ASSERT_MEM_EQ(b.base, "before", 6);
    pc_buf_free(&b);
    pc_set_allocator(&prev);
}

static int write_page(const char *path)
{
    pc_buf_t b = page();
    FILE *f = fopen(path, "wb");
    int bad = f == NULL || fwrite(b.base, 1, b.len, f) != b.len;
    if (f != NULL && fclose(f) != 0)
        bad = 1;
    pc_buf_free(&b);
    if (bad)
        fprintf(stderr, "cannot write %s\n", path);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write") == 0)
        return write_page(argv[2]);
    return pc_test__main(argc, argv);
}
